"""The environment server's cost and scaling (issue 47), measured side by side in one run.

Verified oracle episodes (components/scripted) on generated tasks, four ways:
1. in-process, one episode at a time (the embedded default);
2. through `agentrl env serve` with 1 worker, one episode at a time: the service's
   overhead (HTTP, JSON, a process hop) as the ratio of episodes/s;
3. through the server with 1 worker, two clients at once;
4. through the server with 2 workers, two clients at once: what a second worker gives.
Each way first runs every task once unmeasured (the verdict cache, components/verifier/
cache.py, is per process: a server's workers warm their own), then --repeats rounds timed,
the four ways taking turns within each round (both servers up throughout), so a load that
drifts during the run weighs on every way alike; the load average is printed at both ends.
Per step, the latency a driver sees (in-process: `EpisodeEnv.step`; remote: the HTTP round
trip of `RemoteEpisode.step`), p50 and p95; verdicts (finish) are counted in episodes/s.

    .venv/bin/python bench/env_service.py [--tasks 4] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.env.config import EnvConfig  # noqa: E402
from components.env.episode import EpisodeEnv, episode_id_for  # noqa: E402
from components.env_service.client import EnvClient, RemoteEpisode  # noqa: E402
from components.sandbox.config import SandboxConfig  # noqa: E402
from components.scripted.registry import make_policy  # noqa: E402
from components.tasks.generate import generate_suite  # noqa: E402
from components.tasks.task import load_tasks  # noqa: E402
from tests.env_service.served_env import served  # noqa: E402


def one_episode(task, url: str | None, client: EnvClient | None) -> tuple[list[float], bool]:
    """One oracle episode to its verdict: (step latencies in s, success)."""
    policy = make_policy("oracle", seed=0)
    kwargs = dict(policy_name=policy.name, episode_id=episode_id_for(policy.name, task, 0))
    if url is None:
        episode = EpisodeEnv(task, EnvConfig(), SandboxConfig(), **kwargs)
    else:
        episode = RemoteEpisode(task, EnvConfig(remote=url), client=client, **kwargs)
    latencies = []
    while not episode.done:
        action = policy.act(task, episode.events)
        start = time.perf_counter()
        episode.step(action)
        latencies.append(time.perf_counter() - start)
    return latencies, episode.finish().success


WAYS = (  # (name, server: None | workers, clients at once)
    ("in-process, 1 at a time", None, 1),
    ("server 1 worker, 1 at a time", 1, 1),
    ("server 1 worker, 2 at a time", 1, 2),
    ("server 2 workers, 2 at a time", 2, 2),
)


def round_of(tasks, url: str | None, clients: int, client: EnvClient | None) -> tuple:
    """Every task once, `clients` episodes at a time: (seconds, [(latencies, success)])."""
    with ThreadPoolExecutor(max_workers=clients) as pool:
        start = time.perf_counter()
        runs = list(pool.map(lambda t: one_episode(t, url, client), tasks))
        return time.perf_counter() - start, runs


def summary(elapsed: float, runs: list) -> dict:
    latencies = sorted(x for lat, _ in runs for x in lat)
    return {
        "episodes": len(runs),
        "success": sum(ok for _, ok in runs),
        "eps": len(runs) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
    }


def measure_interleaved(tasks, urls: dict[int, str], repeats: int) -> dict[str, dict]:
    """One unmeasured round per way (a server's workers warm their own verdict cache), then
    `repeats` timed rounds, the ways taking turns within each: a machine whose load drifts
    (a benchmark beside this one) weighs on every way alike."""
    clients = {w: EnvClient(url) for w, url in urls.items()}
    for _name, workers, n in WAYS:
        round_of(tasks, urls.get(workers), n, clients.get(workers))
    elapsed = {name: 0.0 for name, _, _ in WAYS}
    runs: dict[str, list] = {name: [] for name, _, _ in WAYS}
    for _ in range(repeats):
        for name, workers, n in WAYS:
            seconds, done = round_of(tasks, urls.get(workers), n, clients.get(workers))
            elapsed[name] += seconds
            runs[name] += done
    return {name: summary(elapsed[name], runs[name]) for name, _, _ in WAYS}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="bench-env-service-") as tmp:
        root = Path(tmp) / "tasks"
        generate_suite(root, args.tasks, 0)
        tasks, errors = load_tasks(root)
        assert not errors, errors
        with served(root, workers=1) as (one_url, _), served(root, workers=2) as (two_url, _):
            rows = measure_interleaved(tasks, {1: one_url, 2: two_url}, args.repeats)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| way | episodes | episodes/s | step p50 ms | step p95 ms |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['episodes']} ({r['success']}/{r['episodes']} success) | "
            f"{r['eps']:.3f} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} |"
        )
    local, one = rows["in-process, 1 at a time"], rows["server 1 worker, 1 at a time"]
    one2, two = rows["server 1 worker, 2 at a time"], rows["server 2 workers, 2 at a time"]
    print(
        f"\nservice overhead ratio (server 1 worker / in-process, episodes/s): "
        f"{one['eps'] / local['eps']:.3f}"
    )
    print(f"step p50 ratio (server / in-process): {one['p50_ms'] / local['p50_ms']:.3f}")
    print(f"2 workers / 1 worker (2 clients, episodes/s): {two['eps'] / one2['eps']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
