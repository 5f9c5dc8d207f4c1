"""The test suite's job cache: one lesson job, checked many ways.

The suite sets COURSE_JOB_CACHE to a folder of its own and installs this wrapper around
`ddpcourse.cluster.launch.launch` in the pytest process (tests/project/conftest.py) and in every
Python process it starts through the fork server (ddpcourse/course/forkserver.py), notebook kernels
included. A lesson script (under scripts/) that a test or a notebook launches, captured, with
exactly the same arguments, shape and settings as earlier in the same test session is not run
again: its recorded output is handed back. So a notebook and a lesson test that run the same
job share one run, and each checks it in its own way. Grading workers, jobs with extra
torchrun options (lesson 6 kills their workers) and uncaptured jobs always run; outside the
tests nothing is cached.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import subprocess

JOB_CACHE = "COURSE_JOB_CACHE"
# The settings a job's result may depend on, besides its command: everything else in the
# environment (a kernel's or pytest's own variables) is the same job.
JOB_SETTINGS = ("COURSE_", "TORCH", "NCCL", "GLOO", "CUDA", "OMP_", "MASTER_", "RANK",
                "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "PYTHONPATH")


def shared_job_cache(script, script_args, nproc, nnodes, backend, env, cwd, capture,
                     rdzv="static"):
    """The file that holds this job's recorded result, or None for a job never cached."""
    folder = os.environ.get(JOB_CACHE, "")
    path = os.path.abspath(os.path.join(cwd or ".", script))
    lesson_script = "scripts" in path.split(os.sep)[:-1]
    if not folder or not capture or not lesson_script:  # captured lesson jobs only
        return None
    settings = sorted((k, v) for k, v in env.items() if k.startswith(JOB_SETTINGS)
                      and k != JOB_CACHE)
    with open(path, "rb") as f:
        content = hashlib.sha256(f.read()).hexdigest()
    key = [path, content, list(script_args or []), nproc, nnodes, backend,
           os.path.abspath(cwd or "."), settings]
    key = json.dumps(key + ([rdzv] if rdzv != "static" else []))
    return os.path.join(folder, hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def record(path: str, result: subprocess.CompletedProcess) -> None:
    data = {"args": result.args, "returncode": result.returncode, "stdout": result.stdout,
            "stderr": result.stderr}
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def replay(path: str, echo: bool) -> subprocess.CompletedProcess:
    with open(path) as f:
        data = json.load(f)
    if echo:
        for cmd in data["args"]:
            print("$ " + " ".join(cmd) + "   # run once in this test session; its output:",
                  flush=True)
    return subprocess.CompletedProcess(data["args"], data["returncode"], data["stdout"],
                                       data["stderr"])


def cached(launch):
    """`launch`, answering a job it has run before in this session from its record."""
    signature = inspect.signature(launch)

    @functools.wraps(launch)
    def launch_once(*args, **kwargs):
        job = signature.bind(*args, **kwargs)
        job.apply_defaults()
        a = job.arguments
        env = dict(os.environ if a["env"] is None else a["env"])
        cache = None if a["torchrun_args"] else shared_job_cache(
            a["script"], a["script_args"], a["nproc"], a["nnodes"], a["backend"], env, a["cwd"],
            a["capture"], a["rdzv"])
        if cache is not None and os.path.exists(cache):
            return replay(cache, a["echo"])
        result = launch(*args, **kwargs)
        if cache is not None:
            record(cache, result)
        return result

    launch_once.uncached = launch
    return launch_once


def install() -> None:
    """Route every later `launch(...)` of this process through the cache (once)."""
    from ddpcourse.cluster import launch as module

    if not hasattr(module.launch, "uncached"):
        module.launch = cached(module.launch)
