"""``kernelrl topology``: the cluster's shape on one machine, as separate processes.

Why: the recipes people launch on a cluster (``recipes/qwen3-14b/trloo/*.yaml``) run a vLLM
server (``vllm_mode: server``), several trainer ranks and the environment as a service on a
Ray cluster. This command brings up exactly those processes, on loopback, with the same
commands a cluster runs on its nodes (it prints each one), so the multi-node guide in
docs/guide/training.md differs from it only by addresses and sizes:

1. a Ray head (``ray start --head --block``): the environment's cluster; on a cluster, the
   head node, with ``ray start --address`` on each environment node;
2. the environment service (``kernelrl env serve --address ...``), a named actor on that
   cluster; restarting it leaves the cluster, and the trainers connected to it, alone;
3. the generation server (``kernelrl serve``: ``trl vllm-serve``'s server; on CPU through
   vLLM's server module and the gloo weight-transfer backend, see ``kernelrl.rl.vllm_gloo``);
4. the trainers: ``accelerate launch --num_processes N`` (DDP; gloo on CPU) running
   ``kernelrl train`` on the server-mode recipe.

It waits for 2 and 3 before starting 4, streams the trainers' console, and stops everything it
started when the trainers end, fail, or it is interrupted. A process that dies ends the run with
one line naming it (``kernelrl topology: error: ...``) and how to resume: the trainers
checkpoint every step, and ``--resume_from_checkpoint latest`` brings the whole topology back
where it stopped. ``<log_dir>/pids.json`` names every process group it started.

    kernelrl topology --train_config recipes/smoke/server_cpu.yaml
    kernelrl topology --train_config recipes/smoke/server_cpu.yaml --resume_from_checkpoint latest
    kernelrl topology --train_config R -- --max_steps 4   # after --: flags of `kernelrl train`
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelrl.launch.reaper import stop_session
from kernelrl.launch.recipe import RecipeError

STOP_GRACE_S = 30.0  # how long a stopped process and its children may take to exit
ENV_READY = "ready:"  # the line `kernelrl env serve` prints once its workers answer


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class TopologyConfig:
    """Keys of ``kernelrl topology`` (each a ``--key value`` flag)."""

    train_config: str = field(
        default="recipes/smoke/server_cpu.yaml",
        metadata=_help("the trainers' recipe (vllm_mode: server, env_pool: service)"),
    )
    env_config: str = field(
        default="recipes/env/local_cpu.yaml",
        metadata=_help("the environment service's recipe (its address is set to the Ray head)"),
    )
    num_processes: int = field(default=2, metadata=_help("trainer ranks (accelerate launch)"))
    start_server: bool = field(
        default=True,
        metadata=_help(
            "start the generation server; false: use the one already serving at the recipe's "
            "vllm_server_host:vllm_server_port (on a cluster, the vLLM node's)"
        ),
    )
    ray_port: int = field(default=6390, metadata=_help("port of the Ray head (GCS)"))
    ray_num_gpus: int = field(
        default=2, metadata=_help("logical GPUs the Ray head offers (one per environment worker)")
    )
    ray_num_cpus: int = field(default=4, metadata=_help("logical CPUs the Ray head offers"))
    main_process_port: int = field(default=29531, metadata=_help("trainers' rendezvous port"))
    log_dir: str = field(default="runs/topology", metadata=_help("every process's log"))
    startup_timeout_s: float = field(
        default=900.0, metadata=_help("wait this long for the server and the service")
    )
    resume_from_checkpoint: str | None = field(
        default=None, metadata=_help("'latest' or a checkpoint folder: passed to the trainers")
    )


class TopologyError(RuntimeError):
    """A process of the topology failed; the message is the one line printed."""


class Topology:
    """The processes, each in its own session (a signal to its group reaches its children)."""

    def __init__(self, config: TopologyConfig, train: Any, train_flags: list[str]) -> None:
        self.config = config
        self.train = train
        self.train_flags = train_flags
        self.log_dir = Path(config.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "token"}
        self.env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        self.env.setdefault("PYTHONUNBUFFERED", "1")

    # ------------------------------------------------------------------ commands
    @property
    def ray_address(self) -> str:
        return f"127.0.0.1:{self.config.ray_port}"

    def commands(self) -> dict[str, list[str]]:
        """What runs, in order; on a cluster the same commands run on their nodes."""
        c, t = self.config, self.train
        python = sys.executable
        kernelrl = [python, "-m", "kernelrl.launch.cli"]
        ray = str(Path(python).with_name("ray"))
        accelerate = str(Path(python).with_name("accelerate"))
        train = [*kernelrl, "train", "--config", c.train_config]
        train += ["--env_ray_address", self.ray_address]
        if c.resume_from_checkpoint:
            train += ["--resume_from_checkpoint", c.resume_from_checkpoint]
        train += self.train_flags
        return {
            "ray": [ray, "start", "--head", "--block", "--port", str(c.ray_port)]
            + ["--node-ip-address", "127.0.0.1"]
            + ["--num-cpus", str(c.ray_num_cpus), "--num-gpus", str(c.ray_num_gpus)]
            + ["--include-dashboard", "false", "--disable-usage-stats"],
            "env": [*kernelrl, "env", "serve", "--config", c.env_config]
            + ["--address", self.ray_address, "--name", t.env_service_name]
            + ["--http", "false", "--store_path", str(self.log_dir.resolve() / "results.db")],
            "server": [*kernelrl, "serve", "--model", t.model_name_or_path]
            + ["--host", t.vllm_server_host, "--port", str(t.vllm_server_port)]
            + ["--dtype", t.dtype or "float32", "--enforce_eager"]
            + ["--max_model_len", str(t.vllm_max_model_length or 2048)],
            # --multi_gpu is accelerate's torchrun launcher (its --cpu would start ONE process
            # without mpirun); the recipe's use_cpu makes each rank take gloo
            "trainers": [accelerate, "launch", "--multi_gpu", "--num_machines", "1"]
            + ["--num_processes", str(c.num_processes), "--mixed_precision", "no"]
            + ["--dynamo_backend", "no", "--main_process_port", str(c.main_process_port)]
            + ["-m", "kernelrl.launch.cli"]
            + train[len(kernelrl) :],
        }

    # ------------------------------------------------------------------ processes
    def start(self, name: str, command: list[str], console: bool = False) -> None:
        print(f"[topology] {name}: {shlex.join(command)}", flush=True)
        out = None if console else open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115
        self.processes[name] = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            env=self.env,
            start_new_session=True,
        )
        (self.log_dir / "pids.json").write_text(
            json.dumps({n: p.pid for n, p in self.processes.items()}, indent=1)
        )

    def check_alive(self, *names: str) -> None:
        for name in names:
            code = self.processes[name].poll()
            if code is not None:
                raise TopologyError(
                    f"the {name} process exited with status {code} while starting "
                    f"(see {self.log_dir / (name + '.log')})"
                )

    def wait_ready(self) -> None:
        """Ray's port, then the service's ready line and the server's /health, together."""
        t = self.train
        deadline = time.monotonic() + self.config.startup_timeout_s
        url = f"http://{t.vllm_server_host}:{t.vllm_server_port}/health"
        started_env = False
        env_ready = server_ready = False
        while not (env_ready and server_ready):
            if time.monotonic() > deadline:
                missing = [n for n, ok in (("env", env_ready), ("server", server_ready)) if not ok]
                raise TopologyError(
                    f"{' and '.join(missing)} not ready after {self.config.startup_timeout_s:.0f}"
                    f" s (see {self.log_dir})"
                )
            self.check_alive(*self.processes)
            if not started_env and _port_open("127.0.0.1", self.config.ray_port):
                time.sleep(2)  # the GCS answers before the head's raylet registered
                self.start("env", self.commands()["env"])
                started_env = True
            if started_env and not env_ready:
                log = (self.log_dir / "env.log").read_text(errors="replace")
                env_ready = ENV_READY in log
            if not server_ready:
                server_ready = _http_ok(url)
            time.sleep(2)
        print("[topology] environment service and generation server ready", flush=True)

    def stop(self) -> None:
        """Each process and all it started (trainers first, the Ray head last), given
        ``STOP_GRACE_S`` to exit."""
        for name in ("trainers", "server", "env", "ray"):
            if name in self.processes:
                stop_session(self.processes[name], STOP_GRACE_S)

    def run(self) -> int:
        commands = self.commands()
        try:
            self.start("ray", commands["ray"])
            if self.config.start_server:
                self.start("server", commands["server"])
            self.wait_ready()
            self.start("trainers", commands["trainers"], console=True)
            code = self.processes["trainers"].wait()
            if code != 0:
                raise TopologyError(self._why_trainers_failed(code))
            return 0
        finally:
            self.stop()

    def _why_trainers_failed(self, code: int) -> str:
        dead = [
            f"{name} (status {p.returncode})"
            for name, p in self.processes.items()
            if name != "trainers" and p.poll() is not None
        ]
        also = f"; stopped before them: {', '.join(dead)}" if dead else ""
        return (
            f"the trainers exited with status {code}{also}; resume with "
            f"`kernelrl topology --train_config {self.config.train_config} "
            "--resume_from_checkpoint latest`"
        )


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((host, port)) == 0


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def add_subcommand(commands: Any) -> None:
    from kernelrl.launch.recipe import add_recipe_command

    add_recipe_command(
        commands,
        "topology",
        help="the cluster's processes on one machine: Ray head, environment service, vLLM "
        "server, accelerate trainers (--train_config FILE [--num_processes N ...] "
        "[-- kernelrl train flags])",
        run=_topology,
        recipe_types=lambda: (TopologyConfig,),
    )


TRAIN_KEYS = {  # what the launcher reads from the trainers' recipe, with TRL's defaults
    "model_name_or_path": None,
    "dtype": "float32",
    "use_vllm": False,
    "vllm_mode": "colocate",
    "vllm_server_host": "0.0.0.0",
    "vllm_server_port": 8000,
    "vllm_max_model_length": 2048,
    "env_pool": "local",
    "env_service_name": "kernelrl-env",
}


def train_keys(recipe: str, flags: list[str]) -> Any:
    """The keys of the trainers' recipe the launcher needs (YAML, then ``--key value`` flags).
    Not the whole recipe: it is checked by each trainer, for its world size (a batch that
    divides into groups across 2 ranks does not in 1 process)."""
    import argparse
    import types

    import yaml

    path = Path(recipe)
    if not path.is_file():
        raise RecipeError(f"recipe {path} does not exist")
    values = {**TRAIN_KEYS, **{k: v for k, v in (yaml.safe_load(path.read_text()) or {}).items()}}
    parser = argparse.ArgumentParser(add_help=False)
    for key in TRAIN_KEYS:
        parser.add_argument(f"--{key}")
    given, _ = parser.parse_known_args(flags)
    values.update({k: v for k, v in vars(given).items() if v is not None})
    for key in ("use_vllm",):
        values[key] = str(values[key]).lower() in ("true", "1", "yes")
    if not values["model_name_or_path"]:
        raise RecipeError(f"{recipe} sets no model_name_or_path")
    if not (values["use_vllm"] and values["vllm_mode"] == "server"):
        raise RecipeError(f"{recipe} does not set use_vllm: true and vllm_mode: server")
    if values["env_pool"] != "service":
        raise RecipeError(f"{recipe} does not set env_pool: service")
    return types.SimpleNamespace(**values)


def _topology(argv: list[str]) -> int:
    from kernelrl.launch.recipe import parse_recipe

    train_flags: list[str] = []
    if "--" in argv:  # what follows goes to every trainer's `kernelrl train`
        at = argv.index("--")
        argv, train_flags = argv[:at], argv[at + 1 :]
    try:
        (config,) = parse_recipe(argv, (TopologyConfig,), "kernelrl topology")
        train = train_keys(config.train_config, train_flags)
    except RecipeError as exc:
        print(f"kernelrl topology: error: {exc}", file=sys.stderr)
        return 2
    topology = Topology(config, train, train_flags)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return topology.run()
    except TopologyError as exc:
        print(f"kernelrl topology: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kernelrl topology: interrupted; every process stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
