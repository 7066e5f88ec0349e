"""One rank of a launch that runs several scenarios (tests/core/dist/_world.py): `python _world_worker.py JOBS`.

Started by _world.launch. JOBS is a JSON list of scenarios, each a rank worker script, its
arguments and the folder it writes its results to. In one process group (which every worker's
`distributed.process_group` reuses instead of creating its own), each scenario runs in turn as its own
`__main__`, exactly as when it is launched alone; once every rank has finished it, rank 0 writes
<its folder>/done, so the scenarios before one that fails keep their results.
"""

from __future__ import annotations

import json
import runpy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from titan_core.runtime import distributed  # noqa: E402


def main(jobs_file: Path) -> None:
    jobs = json.loads(jobs_file.read_text())
    with distributed.process_group(torch.device("cpu"), timeout_s=180) as state:
        for job in jobs:
            t0, cpu0 = time.monotonic(), time.process_time()
            print(f"scenario {job['name']}: {Path(job['worker']).name} {' '.join(job['argv'])}", flush=True)
            sys.argv = [job["worker"], *job["argv"]]
            runpy.run_path(job["worker"], run_name="__main__")
            dist.barrier()
            if state.rank == 0:
                (Path(job["out"]) / "done").touch()
            print(f"scenario {job['name']}: done in {time.monotonic() - t0:.1f} s, "
                  f"{time.process_time() - cpu0:.1f} s of this rank's CPU", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
