"""Ray job: top-k MDS of saved counts by block Lanczos, on a GPU when there is one.

    python -m posstats.jobs.eigensolve --counts runs/counts --k 64 --out runs/mds [--address ADDR]
        [--tol 1e-8] [--block 8] [--device auto|cpu|gpu] [--min-occupancy K] [--buckets log:8]

One :class:`jobs.hellinger.GeometryWorker` actor (``num_gpus=1`` when
``ray.cluster_resources()`` has a GPU, else ``num_cpus=1``) reads the counts and calls
:func:`posstats.geometry.mds.classical_mds` with ``method="lanczos"``: block Lanczos on the implicit
centred square-root operator, never an n x n matrix and never a densified ``S_c``; on the
GPU its products run with cupy / ``cupyx.scipy.sparse`` (float64). It writes
``OUT/mds.safetensors`` (positions, eigenvalues, encoding, residuals); the driver writes
``OUT/eigensolve.json`` last: eigenvalues, the tolerance, the largest residual
``||A x - theta x|| / theta_1`` (a check, not an estimate), device and seconds.
"""

from __future__ import annotations

import argparse
import sys

from posstats.errors import PosstatsError
from posstats.storage import jsontext

from .hellinger import add_common_args, run_job
from .output import ArgumentParser

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m posstats.jobs.eigensolve", description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--k", type=int, default=64, help="leading eigenpairs (default 64)")
    p.add_argument("--tol", type=float, default=1e-8, help="residual tolerance relative to the top eigenvalue (default 1e-8)")
    p.add_argument("--block", type=int, default=8, help="Lanczos block size (default 8)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.k < 1:
        print(f"posstats: error: --k must be >= 1, got {args.k}", file=sys.stderr)
        return 2
    try:
        summary = run_job(
            args,
            "eigensolve",
            k=args.k,
            tol=args.tol,
            block=args.block,
            min_occupancy=args.min_occupancy,
            buckets=args.buckets,
            seed=args.seed,
        )
    except PosstatsError as exc:
        print(f"posstats: error: {exc}", file=sys.stderr)
        return 2
    print(jsontext.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
