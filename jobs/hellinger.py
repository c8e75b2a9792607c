"""Ray job: the squared Hellinger distance matrix of saved counts, on a GPU when there is one.

    python -m posstats.jobs.hellinger --counts runs/counts --out runs/hellinger [--address ADDR]
        [--min-occupancy K] [--block B] [--device auto|cpu|gpu]
    ray job submit --address http://127.0.0.1:8265 -- python -m posstats.jobs.hellinger ...

What runs where: the driver joins ``--address`` (or ``$RAY_ADDRESS``, else starts a local
Ray), looks at ``ray.cluster_resources()`` and starts one :class:`GeometryWorker` actor with
``num_gpus=1`` when the cluster has a GPU (``num_cpus=1`` otherwise). The actor reads the
counts itself, calls :func:`posstats.geometry.hellinger.hellinger_sq` (cupy arrays on the GPU, the
sparse numpy/scipy path on a CPU), writes ``OUT/hellinger.safetensors`` (``d2``: n x n
float64 squared distances of the used positions, ``positions``, ``occupancy``) and returns a
small summary; the driver writes ``OUT/hellinger.json`` last. The distances are the plug-in
``d_H^2(mu_hat_i, mu_hat_j)``, uncorrected: the bias-corrected ones ``posstats analyze``
reports subtract each position's sampling variance and its square roots' occupancy
shrinkage (:mod:`posstats.estimates.occupancy`), both from the ``occupancy`` saved beside
them and the counts.

Numerics are the library's: float64 Gram products in row blocks (never TF32/bf16, which
apply to float32 only), diagonal pinned to 0, negatives clipped, near-identical pairs
recomputed by the difference form, so GPU and CPU results agree to ~1e-12. On the GPU the
square-root rows (n x V) and the n x n result must fit device memory together; otherwise
the actor falls back to the host's sparse path (and says so in the summary).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from safetensors.numpy import save_file

from posstats.counting.buckets import parse_buckets
from posstats.counting.io import counts_file, load_counts
from posstats.counting.rows import select_rows
from posstats.errors import PosstatsError
from posstats.geometry.backend import get_cupy, to_numpy
from posstats.geometry.hellinger import distance_summary, hellinger_sq
from posstats.geometry.mds import classical_mds
from posstats.memory import gpu_fits
from posstats.runs.run_folder import MDS_FILE, write_mds
from posstats.storage import jsontext
from posstats.storage.jsontext import write_json_atomic
from posstats.storage.publish import atomic_path

from .connect import connect_ray
from .output import ArgumentParser, peak_rss_bytes

__all__ = ["GeometryWorker", "build_parser", "connect", "main", "start_worker"]

GPU_MEMORY_SHARE = 0.8  # of the free device memory a GPU distance matrix may take


def connect(address: str | None) -> bool:
    """Join ``address`` / ``$RAY_ADDRESS``, or start a local Ray; True when started here."""
    return connect_ray(address)[0]


def _load_rows(counts_path: str, min_occupancy: int, buckets: str) -> tuple[Any, np.ndarray, np.ndarray, str]:
    """(rows (m, V), positions (m,), occupancy (m,), fingerprint) of saved counts: bucketed
    by ``buckets`` (``none|fixed:W|log:P``), occupied rows only (:func:`posstats.counting.rows.select_rows`)."""
    counts = load_counts(counts_path)
    selection = select_rows(counts, min_occupancy=min_occupancy, buckets=parse_buckets(buckets, counts.positions))
    return selection.rows(), selection.positions, selection.occupancy(), selection.counts.fingerprint


def _hellinger_on_device(rows: Any, *, block: int, device: str) -> tuple[np.ndarray, str]:
    """Squared Hellinger distances (n x n float64, on the host) and where they were computed:
    on the GPU when ``device == "gpu"`` and they fit its memory, else on the host."""
    n, v = rows.shape
    if device == "gpu" and gpu_fits(8 * (2 * n * v + 2 * n * n), share=GPU_MEMORY_SHARE):
        cp = get_cupy()
        dense = rows.toarray() if sp.issparse(rows) else np.asarray(rows)
        d2 = to_numpy(hellinger_sq(cp.asarray(dense), block=block))
        del dense
        cp.get_default_memory_pool().free_all_blocks()
        return d2, "gpu"
    return hellinger_sq(rows, block=block), "cpu"


def _write_tensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """Write a safetensors file atomically (C-contiguous arrays, string metadata)."""
    with atomic_path(path) as tmp:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp), metadata=metadata)


class GeometryWorker:
    """An actor holding the device context: distances and eigensolves of saved counts."""

    def __init__(self, device: str, cwd: str) -> None:
        if os.path.isdir(cwd):
            os.chdir(cwd)
        self.device = device

    def where(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "hostname": socket.gethostname(), "device": self.device}

    def hellinger(self, counts_path: str, out: str, min_occupancy: int, block: int, buckets: str) -> dict[str, Any]:
        """Write ``out/hellinger.safetensors``; return a summary."""
        t = time.perf_counter()
        rows, positions, occupancy, fingerprint = _load_rows(counts_path, min_occupancy, buckets)
        d2, used = _hellinger_on_device(rows, block=block, device=self.device)
        _write_tensors(
            Path(out) / "hellinger.safetensors",
            {"d2": d2, "positions": np.asarray(positions, dtype=np.int64), "occupancy": np.asarray(occupancy, dtype=np.int64)},
            {"schema": "posstats.hellinger/1", "device": used, "fingerprint": fingerprint},
        )
        return {
            "positions_used": int(rows.shape[0]),
            "device": used,
            "seconds": round(time.perf_counter() - t, 3),
            "d_h": distance_summary(d2),
        }

    def eigensolve(
        self, counts_path: str, out: str, k: int, tol: float, block: int, min_occupancy: int, buckets: str, seed: int
    ) -> dict[str, Any]:
        """Top-k MDS by block Lanczos; write ``out/mds.safetensors``; return a summary."""
        t = time.perf_counter()
        rows, positions, _, fingerprint = _load_rows(counts_path, min_occupancy, buckets)
        xp = get_cupy() if self.device == "gpu" else None
        mds = classical_mds(rows, k=k, method="lanczos", tol=tol, block=block, seed=seed, xp=xp)
        write_mds(Path(out) / MDS_FILE, positions, mds, fingerprint=fingerprint, residuals=True,
                  metadata={"device": self.device})
        return {
            "positions_used": int(len(positions)),
            "k": int(mds.eigenvalues.size),
            "device": self.device,
            "tol": float(tol),
            "max_residual": float(mds.residuals.max()),
            "converged": bool(mds.residuals.max() <= 10 * tol),
            "total_variance": float(mds.total_variance),
            "eigenvalues": [float(x) for x in mds.eigenvalues],
            "seconds": round(time.perf_counter() - t, 3),
            "peak_rss_bytes": peak_rss_bytes(),
        }


def start_worker(device: str = "auto") -> tuple[Any, str]:
    """A :class:`GeometryWorker` actor: ``num_gpus=1`` when the cluster has a GPU (or
    ``device="gpu"``), else ``num_cpus=1``; returns (actor, device)."""
    import ray

    has_gpu = float(ray.cluster_resources().get("GPU", 0)) >= 1
    if device == "gpu" and not has_gpu:
        raise PosstatsError("--device gpu: the Ray cluster has no GPU")
    use_gpu = has_gpu if device == "auto" else device == "gpu"
    opts = {"num_gpus": 1, "num_cpus": 1} if use_gpu else {"num_cpus": 1}
    actor = ray.remote(GeometryWorker).options(**opts).remote("gpu" if use_gpu else "cpu", os.getcwd())
    return actor, "gpu" if use_gpu else "cpu"


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--counts", required=True, metavar="DIR", help="counts folder (or file) from 'posstats count'")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--address", metavar="ADDR", help="Ray cluster (default $RAY_ADDRESS, else a local Ray)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="auto: a GPU actor when the cluster has a GPU (default)")
    p.add_argument("--min-occupancy", type=int, default=1, metavar="K",
                   help="leave out positions with fewer than K counted tokens (default 1: every occupied one)")
    p.add_argument("--buckets", default="none", metavar="none|fixed:W|log:P",
                   help="merge positions into buckets before the geometry: none (default), fixed:W (W positions "
                        "each) or log:P (P buckets an octave)")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m posstats.jobs.hellinger", description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--block", type=int, default=4096, metavar="B", help="rows per Gram block (default 4096)")
    return p


def run_job(args: argparse.Namespace, method: str, /, *, extra: dict[str, Any] | None = None,
            **kwargs: Any) -> dict[str, Any]:
    """Start the actor, run ``method`` on it (with ``kwargs``), add ``extra`` to its summary,
    write OUT/<job>.json last, stop what we started."""
    import ray

    counts_file(args.counts)  # a missing or foreign path fails here, before any actor starts
    started = connect(args.address)
    actor = None
    try:
        actor, device = start_worker(args.device)
        where = ray.get(actor.where.remote())
        summary = ray.get(getattr(actor, method).remote(os.path.abspath(args.counts), os.path.abspath(args.out), **kwargs))
        summary["actor"] = where
        summary.update(extra or {})
        write_json_atomic(Path(args.out) / f"{'hellinger' if method == 'hellinger' else 'eigensolve'}.json", summary)
        return summary
    finally:
        if actor is not None:
            ray.kill(actor, no_restart=True)
        if started:
            ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = run_job(args, "hellinger", min_occupancy=args.min_occupancy, block=args.block, buckets=args.buckets)
    except PosstatsError as exc:
        print(f"posstats: error: {exc}", file=sys.stderr)
        return 2
    print(jsontext.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
