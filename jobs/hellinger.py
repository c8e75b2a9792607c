"""Ray job: the squared Hellinger distance matrix of saved counts, on a GPU when there is one.

    python -m jobs.hellinger --counts runs/counts --out runs/hellinger [--address ADDR]
        [--min-occupancy K] [--block B] [--device auto|cpu|gpu]
    ray job submit --address http://127.0.0.1:8265 -- python -m jobs.hellinger ...

What runs where: the driver joins ``--address`` (or ``$RAY_ADDRESS``, else starts a local
Ray), looks at ``ray.cluster_resources()`` and starts one :class:`GeometryWorker` actor with
``num_gpus=1`` when the cluster has a GPU (``num_cpus=1`` otherwise). The actor reads the
counts itself, calls :func:`posstats.geometry.hellinger.hellinger_sq` (cupy arrays on the GPU, the
sparse numpy/scipy path on a CPU), writes ``OUT/hellinger.safetensors`` (``d2``: n x n
float64 squared distances of the used positions, ``positions``, ``occupancy``) and returns a
small summary; the driver writes ``OUT/hellinger.json`` last.

Numerics are the library's: float64 Gram products in row blocks (never TF32/bf16, which
apply to float32 only), diagonal pinned to 0, negatives clipped, near-identical pairs
recomputed by the difference form, so GPU and CPU results agree to ~1e-12. On the GPU the
square-root rows (n x V) and the n x n result must fit device memory together; otherwise
the actor falls back to the host's sparse path (and says so in the summary).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from jobs.connect import connect_ray

__all__ = ["GeometryWorker", "build_parser", "connect", "main", "start_worker"]


def connect(address: str | None) -> bool:
    """Join ``address`` / ``$RAY_ADDRESS``, or start a local Ray; True when started here."""
    return connect_ray(address)[0]


class GeometryWorker:
    """An actor holding the device context: distances and eigensolves of saved counts."""

    def __init__(self, device: str, cwd: str) -> None:
        if os.path.isdir(cwd):
            os.chdir(cwd)
        self.device = device

    def where(self) -> dict[str, Any]:
        import socket

        return {"pid": os.getpid(), "hostname": socket.gethostname(), "device": self.device}

    def _rows(self, counts_path: str, min_occupancy: int, buckets: str) -> tuple[Any, Any, Any, str]:
        from posstats.counting.buckets import bucket_counts, parse_buckets
        from posstats.counting.io import load_counts

        counts = load_counts(counts_path)
        b = parse_buckets(buckets, counts.positions)
        if b is not None:
            counts = bucket_counts(counts, b)
        index = counts.occupied_positions(min_occupancy=min_occupancy)
        positions = b.midpoints[index] if b is not None else index
        rows = counts.matrix if counts.is_sparse and index.size == counts.positions else counts.rows(index)
        return rows, positions, counts.occupancy()[index], counts.fingerprint

    def hellinger(self, counts_path: str, out: str, min_occupancy: int, block: int, buckets: str) -> dict[str, Any]:
        """Write ``out/hellinger.safetensors``; return a summary."""
        import numpy as np
        import scipy.sparse as sp
        from safetensors.numpy import save_file

        from posstats.geometry.hellinger import hellinger_sq
        from posstats.counting.io import atomic_path

        t = time.perf_counter()
        rows, positions, occupancy, fingerprint = self._rows(counts_path, min_occupancy, buckets)
        n, v = rows.shape
        used = "cpu"
        if self.device == "gpu":
            import cupy

            free, _ = cupy.cuda.runtime.memGetInfo()
            # counts + square roots (n x V) and the result plus one block temporary (n x n)
            need = 8 * (2 * n * v + 2 * n * n)
            if need < 0.8 * free:
                dense = rows.toarray() if sp.issparse(rows) else np.asarray(rows)
                d2 = cupy.asnumpy(hellinger_sq(cupy.asarray(dense), block=block))
                used = "gpu"
                del dense
                cupy.get_default_memory_pool().free_all_blocks()
        if used == "cpu":
            d2 = hellinger_sq(rows, block=block)
        Path(out).mkdir(parents=True, exist_ok=True)
        with atomic_path(Path(out) / "hellinger.safetensors") as tmp:
            save_file(
                {
                    "d2": np.ascontiguousarray(d2),
                    "positions": np.asarray(positions, dtype=np.int64),
                    "occupancy": np.asarray(occupancy, dtype=np.int64),
                },
                str(tmp),
                metadata={"schema": "posstats.hellinger/1", "device": used, "fingerprint": fingerprint},
            )
        off = np.sqrt(d2[~np.eye(n, dtype=bool)])
        return {
            "positions_used": int(n),
            "device": used,
            "seconds": round(time.perf_counter() - t, 3),
            "d_h": {"min": float(off.min()), "mean": float(off.mean()), "max": float(off.max())} if off.size else {},
        }

    def eigensolve(
        self, counts_path: str, out: str, k: int, tol: float, block: int, min_occupancy: int, buckets: str, seed: int
    ) -> dict[str, Any]:
        """Top-k MDS by block Lanczos; write ``out/mds.safetensors``; return a summary."""
        import numpy as np
        from safetensors.numpy import save_file

        from posstats.geometry.mds import classical_mds
        from posstats.counting.io import atomic_path

        t = time.perf_counter()
        rows, positions, occupancy, fingerprint = self._rows(counts_path, min_occupancy, buckets)
        xp = None
        if self.device == "gpu":
            from posstats.geometry.backend import get_cupy

            xp = get_cupy()
        mds = classical_mds(rows, k=k, method="lanczos", tol=tol, block=block, seed=seed, xp=xp)
        Path(out).mkdir(parents=True, exist_ok=True)
        with atomic_path(Path(out) / "mds.safetensors") as tmp:
            save_file(
                {
                    "positions": np.asarray(positions, dtype=np.int64),
                    "eigenvalues": np.ascontiguousarray(mds.eigenvalues),
                    "encoding": np.ascontiguousarray(mds.encoding),
                    "residuals": np.ascontiguousarray(mds.residuals),
                },
                str(tmp),
                metadata={"schema": "posstats.mds/1", "method": mds.method, "device": self.device, "fingerprint": fingerprint},
            )
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
        }


def start_worker(device: str = "auto") -> tuple[Any, str]:
    """A :class:`GeometryWorker` actor: ``num_gpus=1`` when the cluster has a GPU (or
    ``device="gpu"``), else ``num_cpus=1``; returns (actor, device)."""
    import ray

    has_gpu = float(ray.cluster_resources().get("GPU", 0)) >= 1
    if device == "gpu" and not has_gpu:
        from posstats.errors import PosstatsError

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
    p.add_argument("--min-occupancy", type=int, default=1, metavar="K")
    p.add_argument("--buckets", default="none", metavar="none|fixed:W|log:P")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jobs.hellinger", description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--block", type=int, default=4096, metavar="B", help="rows per Gram block (default 4096)")
    return p


def run_job(args: argparse.Namespace, method: str, **kwargs: Any) -> dict[str, Any]:
    """Start the actor, run ``method`` on it, write OUT/<job>.json last, stop what we started."""
    import ray

    from posstats.counting.io import counts_file, write_json_atomic

    counts_file(args.counts)  # a missing or foreign path fails here, before any actor starts
    started = connect(args.address)
    actor = None
    try:
        actor, device = start_worker(args.device)
        where = ray.get(actor.where.remote())
        summary = ray.get(getattr(actor, method).remote(os.path.abspath(args.counts), os.path.abspath(args.out), **kwargs))
        summary["actor"] = where
        write_json_atomic(Path(args.out) / f"{'hellinger' if method == 'hellinger' else 'eigensolve'}.json", summary)
        return summary
    finally:
        if actor is not None:
            ray.kill(actor, no_restart=True)
        if started:
            ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    import json

    from posstats.errors import PosstatsError

    args = build_parser().parse_args(argv)
    try:
        summary = run_job(args, "hellinger", min_occupancy=args.min_occupancy, block=args.block, buckets=args.buckets)
    except PosstatsError as exc:
        print(f"posstats: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
