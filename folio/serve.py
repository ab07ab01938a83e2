"""`folio serve`: start scheduler, executor and frontend on one machine and supervise them.

Sockets live in a private run directory (mode 0700) unless a client address is given.
A crashed executor is restarted (the scheduler fails its in-flight requests and accepts the
new one); a crashed scheduler or frontend, or too many executor crashes, stop everything
and `folio serve` exits 1. With --data-parallel-size M it runs M scheduler+executor pairs
(replicas, each its own KV pool and sockets) behind the frontend, which routes each request
to one; there a crashed scheduler is restarted too (its replica's requests fail, the others
serve on), and on CPU each replica's executor gets its own share of the cores. Ctrl-C or
SIGTERM drains the frontend first (running requests may finish within --shutdown-timeout),
then stops the others and removes the run directory.

Its settings arrive checked (folio/checks.py's ServePlan); each child's command line is
generated from them (folio/flags.py's config_flags).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from folio.checks import ServePlan
from folio.flags import config_flags
from folio.frontend.openai.field_parsers import served_names
from folio.placement import executor_runs_on_cpu, pin, plan_placement
from folio.shared.cpus import usable_cores
from folio.shared.transport import ipc_address, make_run_dir

STOP_GRACE_S = 5.0


def _die_with_parent() -> None:
    """Children get SIGTERM if `folio serve` itself is killed: no orphans."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Supervisor:
    def __init__(self, plan: ServePlan) -> None:
        """`plan` is checked (folio/checks.py): nothing here refuses a setting."""
        self.plan = plan
        self.model = plan.engine.model
        self.config = plan.engine
        self.replicas = plan.serve.data_parallel_size
        self.run_dir = make_run_dir()
        self.scheduler_configs = [plan.scheduler_config(
            frontend_address=ipc_address(self.run_dir, "scheduler-frontends" + suffix),
            executor_address=ipc_address(self.run_dir, "scheduler-executor" + suffix),
            replica=index if self.replicas > 1 else None)
            for index, suffix in enumerate(self._suffixes())]
        self.scheduler_config = self.scheduler_configs[0]
        self.frontend_address = ",".join(c.frontend_address for c in self.scheduler_configs)
        self.client_address = plan.serve.zmq_address or ipc_address(self.run_dir, "client")
        on_cpu = executor_runs_on_cpu(self.config.device)
        policy = plan.serve.cpu_placement
        self.placement = plan_placement(policy, usable_cores(), on_cpu)
        self.replica_cores = replica_cores(policy, usable_cores(), on_cpu, self.replicas)
        self.procs: dict[str, subprocess.Popen] = {}
        self.stopping = False

    def _suffixes(self) -> list[str]:
        """Process and socket name suffixes: none with one replica, -0, -1, ... with more."""
        return [""] if self.replicas == 1 else [f"-{i}" for i in range(self.replicas)]

    def names(self) -> list[str]:
        """Every process in start order: schedulers and executors, then the frontend."""
        return [f"{role}{suffix}" for suffix in self._suffixes()
                for role in ("scheduler", "executor")] + ["frontend"]

    def command(self, name: str) -> list[str]:
        """A child's command line, its flags generated from the checked settings."""
        role, _, index = name.partition("-")
        replica = int(index or 0)
        plan = self.plan
        base = [sys.executable, "-m", "folio", "--log-level", plan.log_level, role]
        if role == "scheduler":
            return base + config_flags(self.scheduler_configs[replica])
        transport = config_flags(plan.transport, skip=("insecure_transport",))
        if role == "executor":
            if plan.transport.insecure_transport and self.config.nnodes > 1:
                transport.append("--insecure-transport")   # the plan hop to other nodes
            return base + ["--model", self.model, "--scheduler-address",
                           self.scheduler_configs[replica].executor_address, *transport,
                           *config_flags(self.config, skip=("model",))]
        if plan.transport.insecure_transport:   # the client address was checked
            transport.append("--insecure-transport")
        http = []
        if plan.http.port:   # the key goes in the environment (child_env), never here
            http = [*config_flags(plan.http, skip=("served_model_name", "api_key",
                                                   "api_key_file", "priority_api_key")),
                    "--served-model-name", *self.served_names()]
        return base + ["--model", self.config.tokenizer_path,
                       "--client-address", self.client_address,
                       "--scheduler-address", self.frontend_address, *transport,
                       *config_flags(plan.shutdown), *config_flags(plan.limits), *http]

    def served_names(self) -> list[str]:
        return served_names(self.plan.http.served_model_name, self.model)

    def start(self, name: str) -> None:
        role, _, index = name.partition("-")
        if self.replica_cores is None:
            cores = self.placement.cores_for(role)
        else:
            cores = self.replica_cores[int(index)] if role == "executor" else None

        def before_exec() -> None:
            _die_with_parent()
            pin(cores)

        self.procs[name] = subprocess.Popen(self.command(name), preexec_fn=before_exec,
                                            env=self.child_env(role))

    def child_env(self, role: str) -> dict[str, str]:
        """The key reaches the frontend in its environment, never on a command line (which
        `ps` shows to every user), and no other process."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("FOLIO_API_KEY", "FOLIO_API_KEY_FILE", "FOLIO_PRIORITY_API_KEY")}
        if role == "frontend" and self.plan.api_key:
            env["FOLIO_API_KEY"] = self.plan.api_key
        if role == "frontend" and self.plan.http.priority_api_key:
            env["FOLIO_PRIORITY_API_KEY"] = self.plan.http.priority_api_key
        return env

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            for name in self.names():
                self.start(name)
            self._announce()
            return self._supervise()
        finally:
            self.stop_all()

    def _announce(self) -> None:
        from folio.client import Client

        deadline = time.monotonic() + 600
        while not self.stopping and time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs.values()):
                return
            client = Client(self.client_address, connect_timeout=1.0,
                            curve_keys=self.plan.transport.curve_keys)
            try:
                if client.health(timeout=1.0).get("ok"):
                    print(self.banner(), flush=True)
                    return
            except Exception:   # not up yet: keep waiting
                pass
            finally:
                client.close()
            time.sleep(0.5)

    def banner(self) -> str:
        """What `folio serve` prints once the frontend answers: the served model's name
        (the one clients ask for) first."""
        http = self.plan.http
        http_line = (f"  HTTP (OpenAI API):  http://{http.host}:{http.port}/v1  (chat page "
                     "at /)\n" if http.port else "")
        return (f"Folio is serving {self.served_names()[0]} (model {self.model})\n"
                f"  clients connect to: {self.client_address}\n{http_line}"
                f"  run directory:      {self.run_dir}\n"
                f"  CPU placement:      {self._describe_placement()}\n"
                f"  pids: " + ", ".join(f"{r}={p.pid}" for r, p in self.procs.items()))

    def _describe_placement(self) -> str:
        if self.replica_cores is None:
            return self.placement.describe()
        return "replicas: " + ", ".join(
            f"executor-{i} on {'any core' if c is None else 'cores ' + ','.join(map(str, c))}"
            for i, c in enumerate(self.replica_cores))

    def _supervise(self) -> int:
        restarts: dict[str, int] = {}   # per replica
        while not self.stopping:
            time.sleep(0.2)
            for name, proc in list(self.procs.items()):
                code = proc.poll()
                if code is None or self.stopping:
                    continue
                role, _, index = name.partition("-")
                # Exit status 2: a setting it refused; a restart would refuse it again.
                # With replicas a scheduler is restarted too: the others serve meanwhile.
                restartable = role == "executor" or (role == "scheduler" and self.replicas > 1)
                done = restarts.get(index, 0)
                if restartable and code != 2 and done < self.plan.serve.executor_restarts:
                    restarts[index] = done + 1
                    print(f"folio serve: {name} exited with {code}; restarting it "
                          f"({done + 1}/{self.plan.serve.executor_restarts})",
                          file=sys.stderr, flush=True)
                    self.start(name)
                    continue
                print(f"folio serve: {name} exited with {code}; stopping", file=sys.stderr,
                      flush=True)
                time.sleep(0.5)   # let the survivors tell clients why their requests failed
                return 1
        return 0

    def _on_signal(self, *_: object) -> None:
        self.stopping = True

    def stop_all(self) -> None:
        frontend = self.procs.get("frontend")
        if frontend is not None and frontend.poll() is None:   # drain first
            frontend.send_signal(signal.SIGTERM)
            try:
                frontend.wait(timeout=self.plan.shutdown.shutdown_timeout_s + STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.client_address.startswith("ipc://"):
            Path(self.client_address.removeprefix("ipc://")).unlink(missing_ok=True)


def replica_cores(policy: str, cores: list[int], executor_on_cpu: bool, replicas: int
                  ) -> list[tuple[int, ...] | None] | None:
    """Each replica's executor cores when replicas compute on the CPU: an equal share each
    (one core each on two cores: their OpenMP threads never meet); cores past an even split
    are left to the frontend and schedulers, which run unpinned. None: one replica, or
    placement off or on a GPU (then `plan_placement` decides)."""
    if replicas == 1 or policy == "off" or (policy == "auto" and not executor_on_cpu):
        return None
    cores = sorted(cores)
    if len(cores) < replicas:   # fewer cores than replicas: they share round the cores
        return [(cores[i % len(cores)],) for i in range(replicas)]
    share = len(cores) // replicas
    return [tuple(cores[i * share:(i + 1) * share]) for i in range(replicas)]


def serve(plan: ServePlan) -> int:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return Supervisor(plan).run()
