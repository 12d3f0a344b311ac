"""``troupe deploy slurm``: one experiment as an sbatch script sized per role, and ``submit.sh``.

The script asks for one allocation and starts one ``srun`` step per role group of the controller's
plan (``params``, ``replay/<policy>``, ``trainer/<policy>``, ``policy/<policy>``, ``actor``,
``eval``), each with as many tasks as the group has workers; task N of a step is worker
``<group>/N``. The controller runs as its own step on the allocation's first node, and the script
ends when the controller does.

**Sizing.** Each step asks for the CPUs and memory of its role (``deploy/sizing.py``: measured
peak memory plus a margin, one CPU per busy process, overridable), with ``--exact`` so steps do
not share CPUs. The allocation is the sum: ``--ntasks`` = total CPUs at one CPU per slot, and
``--mem-per-cpu`` = total memory / total CPUs, rounded up to a MiB. A 64-actor cartpole run asks
for 72 CPUs (64 actors, four policy workers), not the 136 a flat two CPUs per worker did.

Why one allocation and not a heterogeneous job: every Slurm site runs plain allocations with
``srun`` steps, while heterogeneous jobs are disabled at some sites, and on the Slurm 22.05 we
tried, the components of one were never scheduled side by side on a node.

**Addresses.** Workers advertise the address of ``--interface`` (e.g. ``ib0``) when given, else
the source address of their route to the controller: the interface the cluster uses to reach it,
never a name that may resolve to a management network. **The image** is pulled once, on the
submit host, by ``submit.sh`` (``apptainer pull`` to a .sif, or ``enroot import`` to a .sqsh, in
the deploy folder), never by every node at job start.

Nobody restarts a step's task when it dies, so each task restarts its own worker a few times
(``worker_task`` in the script), as the controller expects of a scheduler, and says how the
worker ended (a signal, an exit code), which the controller cannot see; a worker that the
controller stopped exits 0 and is not restarted, nor is one whose controller is gone (exit 3:
restarted, each waited for a controller that no longer was until the job cancelled it). A
SIGTERM to the step (the job's end, ``scancel``) ends the task's bash with its worker; one to
the worker alone (``kill PID``) leaves the job running, and the worker is restarted.

Longer than 400 lines because the script is one generated text whose parts (header, setup,
runtime, worker task, steps, finish) read best in the order the script runs them.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from api.config import ExperimentConfig
from distributed.deploy.manifests import RoleGroup, config_json, role_groups
from distributed.deploy.sizing import MEASURED, RoleNeeds, needs_of
from distributed.errors import DeployError
from system import run_folder
from system.run.worker_arguments import CONTROLLER_WAIT_S
from system.run.worker_record import PROGRESS_S

RUNTIMES = ("apptainer", "singularity", "enroot", "none")
SCRIPT_NAME = "troupe.sbatch"
SUBMIT_NAME = "submit.sh"
_TIME = r"^(\d+-)?\d{1,3}:\d{2}:\d{2}$"


def time_seconds(limit: str) -> int:
    """Seconds of a ``HH:MM:SS`` or ``D-HH:MM:SS`` time limit."""
    days, _, clock = limit.rpartition("-")
    hours, minutes, seconds = (int(x) for x in clock.split(":"))
    return (int(days or 0) * 24 + hours) * 3600 + minutes * 60 + seconds


@dataclass(frozen=True)
class SlurmOptions:
    """Where and how the job runs; the experiment itself says which workers."""

    run_name: str
    run_dir: Path
    """Absolute path of the run folder on a file system every node mounts."""
    deploy_dir: Path
    """Absolute path of the generated files (config.json, keys) read at job start."""
    image: str | None = None
    """``docker://`` reference or a local ``.sif`` for apptainer/singularity; an image for
    enroot (pyxis)."""
    code: Path | None = None
    """A checked-out Troupe with its venv (runtime ``none``)."""
    venv: Path | None = None
    runtime: str = "apptainer"
    partition: str | None = None
    time: str = "04:00:00"
    gpus_per_trainer: int = 0
    nodes: int | None = None
    max_restarts: int = 3
    requeue: bool = True
    """Let Slurm requeue the job after a preemption or a node failure; the requeued job's
    controller resumes the run from its run folder (the last persisted version)."""
    stop_warning_s: int = 180
    """SIGINT to every step this long before the time limit: the controller stops the run in
    order, so the final version and the summary are written before Slurm kills anything."""
    extra_sbatch: tuple[str, ...] = ()
    needs: dict[str, RoleNeeds] = field(default_factory=lambda: dict(MEASURED))
    """CPUs and peak memory per component (``deploy/sizing.py``)."""
    interface: str | None = None
    """Network interface whose address workers and the controller advertise (e.g. ``ib0``)."""

    def check(self) -> SlurmOptions:
        """Every problem with the options at once."""
        errors = []
        if self.runtime not in RUNTIMES:
            errors.append(f"--container-runtime {self.runtime}: use one of {', '.join(RUNTIMES)}")
        if self.runtime == "none" and self.code is None:
            errors.append("--container-runtime none runs checked-out code: pass --code DIR")
        if self.runtime != "none" and not self.image:
            errors.append(f"--container-runtime {self.runtime} needs --image IMAGE")
        if self.code is not None and self.image:
            errors.append("pass either --image (a container) or --code (a checkout), not both")
        troupe = self.troupe_executable()
        if self.code is not None and troupe is not None and not Path(troupe).exists():
            errors.append(f"{troupe} does not exist: make the venv (pip install -e DIR) or --venv")
        if self.runtime == "enroot" and self.image and self.image.endswith(".sif"):
            errors.append("enroot (pyxis) takes an image reference or .sqsh, not a .sif")
        if not re.match(_TIME, self.time):
            errors.append(f"--time {self.time}: write HH:MM:SS or D-HH:MM:SS")
        elif 0 < (limit := time_seconds(self.time)) <= self.stop_warning_s:
            errors.append(
                f"--time {self.time} ({limit} s) is within --stop-warning {self.stop_warning_s} s "
                "of its start: the run would be told to stop as it starts; raise --time or "
                "lower --stop-warning"
            )
        if self.gpus_per_trainer < 0 or self.max_restarts < 0:
            errors.append("--gpus-per-trainer and --max-restarts must be >= 0")
        if not 0 <= self.stop_warning_s <= 65535:
            errors.append(f"--stop-warning {self.stop_warning_s}: seconds, 0 to 65535")
        if self.interface is not None and not re.fullmatch(
            r"[A-Za-z0-9_.:@-]{1,15}", self.interface
        ):
            errors.append(f"--interface {self.interface}: not a network interface name (ib0, eth1)")
        if errors:
            raise DeployError("cannot write the sbatch script:\n  - " + "\n  - ".join(errors))
        return self

    def troupe_executable(self) -> str | None:
        if self.code is None:
            return None
        return str((self.venv or self.code / ".venv") / "bin" / "troupe")


@dataclass(frozen=True)
class StepSize:
    """What one task of a step asks for."""

    cpus: int
    memory_mib: int

    @property
    def mem_per_cpu(self) -> int:
        return math.ceil(self.memory_mib / self.cpus)


def step_sizes(groups: list[RoleGroup], options: SlurmOptions) -> dict[str, StepSize]:
    """Per group name (and ``controller``): CPUs and memory of one task."""
    sizes = {}
    for name, component in [("controller", "controller")] + [(g.name, g.component) for g in groups]:
        need = needs_of(options.needs, component)
        sizes[name] = StepSize(need.slurm_cpus, need.memory_mib)
    return sizes


def allocation(groups: list[RoleGroup], options: SlurmOptions) -> tuple[int, int]:
    """``(CPUs, memory per CPU in MiB)`` of the whole job: the sum of its steps."""
    sizes = step_sizes(groups, options)
    replicas = {"controller": 1, **{g.name: g.replicas for g in groups}}
    cpus = sum(sizes[n].cpus * r for n, r in replicas.items())
    memory = sum(sizes[n].cpus * sizes[n].mem_per_cpu * r for n, r in replicas.items())
    return cpus, math.ceil(memory / cpus)


def build_script(config: ExperimentConfig, options: SlurmOptions) -> str:
    """The sbatch script's text."""
    groups = role_groups(config)
    return "\n".join(
        [
            *_header(groups, options),
            *_setup(options),
            *_runtime(options),
            *_worker_task(options),
            *_steps(groups, options),
            *_finish(),
        ]
    )


def _total_gpus(groups: list[RoleGroup], options: SlurmOptions) -> int:
    trainers = sum(g.replicas for g in groups if g.component == "trainer")
    return trainers * options.gpus_per_trainer


def _header(groups: list[RoleGroup], options: SlurmOptions) -> list[str]:
    cpus, mem_per_cpu = allocation(groups, options)
    sizes = step_sizes(groups, options)
    lines = [
        "#!/bin/bash",
        f"# Troupe run {options.run_name}, generated by troupe deploy slurm.",
        f"# Submit with: {options.deploy_dir / SUBMIT_NAME} (pulls the image once, then sbatch)",
        "#",
        "# What each step asks for (troupe deploy slurm --cpus/--memory/--measured change it):",
        f"#   {'step':<20} {'tasks':>5} {'CPUs/task':>9} {'MiB/task':>8}",
    ]
    replicas = {"controller": 1, **{g.name: g.replicas for g in groups}}
    for name, size in sizes.items():
        memory = size.cpus * size.mem_per_cpu
        lines.append(f"#   {name:<20} {replicas[name]:>5} {size.cpus:>9} {memory:>8}")
    lines += [
        f"#   total: {cpus} CPUs, {cpus * mem_per_cpu} MiB",
        f"#SBATCH --job-name=troupe-{options.run_name}",
        f"#SBATCH --ntasks={cpus}",
        "#SBATCH --cpus-per-task=1",
        f"#SBATCH --mem-per-cpu={mem_per_cpu}M",
        f"#SBATCH --time={options.time}",
        f"#SBATCH --output={options.deploy_dir}/slurm-%j.out",
        "#SBATCH --open-mode=append",  # a requeued job goes on in the same output file
        "#SBATCH --requeue" if options.requeue else "#SBATCH --no-requeue",
    ]
    if options.stop_warning_s:
        lines.append(f"#SBATCH --signal=INT@{options.stop_warning_s}")
    if options.partition:
        lines.append(f"#SBATCH --partition={options.partition}")
    if options.nodes:
        lines.append(f"#SBATCH --nodes={options.nodes}")
    if _total_gpus(groups, options):
        lines.append(f"#SBATCH --gpus={_total_gpus(groups, options)}")
    lines += [f"#SBATCH {line}" for line in options.extra_sbatch]
    return [*lines, "set -euo pipefail", ""]


_RECORD_PRINTF = (
    """printf '{"launcher": "slurm", "run": "%s", "run_dir": "%s", "job_id": "%s", """
    """"host": "%s", "started": %s}\\n' """
)
"""The job's launch record (run name, run folder, job id, host, start), written at its start."""


def _setup(options: SlurmOptions) -> list[str]:
    """Run folder, config.json and owner-only keys, and the controller's address: the first
    node of the allocation, on a port derived from the job id so two runs sharing a node differ.
    The keys are copied from the deploy folder, never written into this script: Slurm keeps
    scripts in its accounting database, readable by administrators."""
    q = shlex.quote
    if options.interface:
        controller_address = f"address_on {q(options.interface)}"
    else:  # the batch script runs on the controller's node: its name's address
        controller_address = "getent ahostsv4 \"$CONTROLLER_HOST\" | awk 'NR == 1 {print $1}'"
    return [
        f"export RUN_DIR={q(str(options.run_dir))}",
        f"DEPLOY_DIR={q(str(options.deploy_dir))}",
        'mkdir -p "$RUN_DIR"',
        f'if [ -f "$RUN_DIR/{run_folder.METRICS}" ]; then',
        '  echo "run folder $RUN_DIR has a run already (restart ${SLURM_RESTART_COUNT:-0}):'
        ' resuming it from its last persisted version" >&2',
        "fi",
        f'cp "$DEPLOY_DIR/{run_folder.CONFIG}" "$RUN_DIR/{run_folder.CONFIG}"',
        'install -m 600 "$DEPLOY_DIR/keys" "$RUN_DIR/keys"',
        "# What troupe status|logs|stop|ps read to find this job (distributed/ops/record.py).",
        _RECORD_PRINTF + f'{q(options.run_name)} "$RUN_DIR" "$SLURM_JOB_ID" "$(hostname)" '
        f'"$(date +%s)" > "$RUN_DIR/{run_folder.LAUNCH}"',
        'export TROUPE_CURVE_KEYS_FILE="$RUN_DIR/keys"',
        "# The IPv4 address of an interface; the source address of the route to a host.",
        'address_on() { ip -4 -o addr show dev "$1" | awk \'{split($4, a, "/"); print a[1]; '
        "exit}'; }",
        "route_to() { ip -4 route get \"$1\" | sed -n 's/.* src \\([0-9.]*\\).*/\\1/p'; }",
        'export CONTROLLER_HOST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
        f'CONTROLLER_ADDRESS="$({controller_address})"',
        'if [ -z "$CONTROLLER_ADDRESS" ]; then',
        '  echo "no address for the controller (interface or host name): see --interface" >&2',
        "  exit 1",
        "fi",
        "export CONTROLLER_ADDRESS",
        'export PORT="${TROUPE_CONTROLLER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}"',
        'export CONTROLLER="tcp://$CONTROLLER_ADDRESS:$PORT"',
        f"export MAX_RESTARTS={options.max_restarts}",
        f"export PROGRESS_S={PROGRESS_S:.0f}  # a worker that ran this long was not crash-looping",
        "",
    ]


def image_file(options: SlurmOptions) -> str | None:
    """Where ``submit.sh`` puts the pulled image (None: nothing to pull)."""
    if options.runtime == "none" or options.image.endswith((".sif", ".sqsh")):
        return None
    suffix = "sqsh" if options.runtime == "enroot" else "sif"
    return str(options.deploy_dir / f"troupe.{suffix}")


def _runtime(options: SlurmOptions) -> list[str]:
    """``troupe_run ARGS``: runs ``troupe ARGS`` inside the site's container runtime."""
    q = shlex.quote
    if options.runtime == "none":
        return [f'troupe_run() {{ {q(options.troupe_executable() or "troupe")} "$@"; }}', ""]
    image = image_file(options) or options.image
    lines = [
        f"export IMAGE_FILE={q(image)}",
        'if [ ! -f "$IMAGE_FILE" ]; then',
        f'  echo "$IMAGE_FILE is missing: run {SUBMIT_NAME} on the submit host, which pulls the '
        'image once" >&2',
        "  exit 1",
        "fi",
    ]
    if options.runtime == "enroot":  # pyxis: srun starts the container, troupe runs inside it
        return [*lines, 'troupe_run() { troupe "$@"; }', ""]
    gpu = "${TROUPE_GPU:+--nv}"  # set on GPU trainer steps only
    tool = options.runtime
    lines.append(
        f'troupe_run() {{ {tool} exec {gpu} --bind "$RUN_DIR" "$IMAGE_FILE" troupe "$@"; }}'
    )
    return [*lines, ""]


def _worker_task(options: SlurmOptions) -> list[str]:
    if options.interface:
        address = f"address_on {shlex.quote(options.interface)}"
    else:
        address = 'route_to "$CONTROLLER_ADDRESS"'
    return [
        *_ENDED_BY,
        "# One task of a worker step: worker <group>/$SLURM_PROCID, restarted when it fails,",
        "# up to MAX_RESTARTS times in a row without running PROGRESS_S (the controller's rule).",
        "worker_task() {",
        '  local role="$1" id="$2" tries=0 address code how started=$SECONDS',
        f'  address="$({address})"',
        '  export TROUPE_ORDINAL="$SLURM_PROCID"',
        '  local worker="${id/\\{ordinal\\}/$SLURM_PROCID}"  # actor/{ordinal}: actor/3',
        '  until troupe_run worker --role "$role" --id "$id" --controller "$CONTROLLER" \\',
        f"      --controller-wait {CONTROLLER_WAIT_S:.0f} \\",  # its controller may come late
        '      --advertise-host "${address:-$(hostname)}"; do',
        "    code=$?",
        '    if [ "$code" -eq 3 ]; then  # orphaned: its controller is gone, the job ends',
        '      echo "worker $worker (task $SLURM_PROCID) left: its controller is gone; not'
        ' restarted" >&2',
        "      return 3",
        "    fi",
        '    how="$(ended_by "$code")"',
        "    # SIGTERM to the step (the job's end, scancel) ends this bash too: here, to it alone",
        '    if [ "$code" -eq 143 ]; then',
        '      how="left on a SIGTERM sent to it alone (one to its step would have ended this'
        ' loop too)"',
        "    fi",
        '    if [ $((SECONDS - started)) -ge "$PROGRESS_S" ]; then tries=0; fi  # it ran a while',
        "    tries=$((tries + 1))",
        '    if [ "$tries" -gt "$MAX_RESTARTS" ]; then',
        '      echo "worker $worker (task $SLURM_PROCID) $how; not restarted: it failed $tries'
        ' times in a row" >&2',
        "      return 1",
        "    fi",
        '    echo "worker $worker (task $SLURM_PROCID) $how; restart $tries of $MAX_RESTARTS" >&2',
        "    started=$SECONDS",
        "  done",
        "}",
        "export -f troupe_run worker_task ended_by address_on route_to",
        "",
    ]


_ENDED_BY = [
    "# How a worker ended, from its exit status: 128 + N is death by signal N. The controller",
    "# sees only a worker gone silent; a task killed for memory says so here.",
    "ended_by() {",
    '  local name hint=""',
    '  if [ "$1" -le 128 ]; then echo "exited with code $1"; return; fi',
    '  name="$(kill -l $(($1 - 128)) 2>/dev/null || true)"',
    '  if [ "$1" -eq 137 ]; then',
    '    hint="; out of memory? sacct -j ${SLURM_JOB_ID:-JOB} says OUT_OF_MEMORY if so"',
    "  fi",
    '  echo "was killed by SIG${name:-$(($1 - 128))} (exit code $1$hint)"',
    "}",
]
"""``ended_by CODE``: ``was killed by SIGKILL (exit code 137; out of memory? ...)`` or ``exited
with code 3`` (the words of the local launcher)."""


def _steps(groups: list[RoleGroup], options: SlurmOptions) -> list[str]:
    sizes = step_sizes(groups, options)
    common = ["--exact", "--kill-on-bad-exit=0"]
    gpus = _total_gpus(groups, options) > 0
    if options.runtime == "enroot":
        common += ['--container-image="$IMAGE_FILE"', '--container-mounts="$RUN_DIR:$RUN_DIR"']

    def size(name: str) -> list[str]:
        return [f"--cpus-per-task={sizes[name].cpus}", f"--mem-per-cpu={sizes[name].mem_per_cpu}M"]

    controller = [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        '--nodelist="$CONTROLLER_HOST"',
        "--job-name=controller",
        *size("controller"),
        *common,
        *(["--gres=none"] if gpus else []),
        'bash -c \'troupe_run controller "$RUN_DIR" --bind "tcp://0.0.0.0:$PORT" '
        '--advertise-host "$CONTROLLER_ADDRESS" --no-display\'',
    ]
    lines = [" ".join(controller) + " &", "controller_pid=$!", "worker_pids=()"]
    for group in groups:
        step = ["srun", f"--ntasks={group.replicas}", f"--job-name={group.name}"]
        step += [*size(group.name), *common]
        if group.component == "trainer" and options.gpus_per_trainer:
            step += [f"--gpus-per-task={options.gpus_per_trainer}", "--export=ALL,TROUPE_GPU=1"]
        elif gpus:
            step.append("--gres=none")
        # Arguments after "bash -c SCRIPT NAME" are the script's "$@": no quoting inside quoting.
        task = " ".join(shlex.quote(a) for a in (group.role, group.id_template))
        lines += [
            " ".join(step) + f" bash -c 'worker_task \"$@\"' worker {task} &",
            'worker_pids+=("$!")',
        ]
    return [*lines, ""]


def _finish() -> list[str]:
    """Wait for the controller; workers leave on its stop message, stragglers are cancelled
    after a minute so the allocation is not held until its time limit."""
    return [
        "status=0",
        'wait "$controller_pid" || status=$?',
        'echo "controller exited with $status" >&2',
        "for _ in $(seq 60); do",
        '  if [ -z "$(jobs -pr)" ]; then break; fi',
        "  sleep 1",
        "done",
        'if [ -n "$(jobs -pr)" ]; then',
        '  echo "cancelling worker steps still running" >&2',
        '  kill -TERM "${worker_pids[@]}" 2>/dev/null || true',
        "fi",
        "wait || true",
        'exit "$status"',
        "",
    ]


def submit_script(options: SlurmOptions) -> str:
    """``submit.sh``: pull the image once here, on the submit host, then ``sbatch``."""
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# Submit Troupe run {options.run_name}: pulls the image once (not on every node), then",
        "# hands the job to Slurm. Extra arguments go to sbatch (e.g. --hold, --test-only).",
        "set -euo pipefail",
    ]
    target = image_file(options)
    if target is not None:
        source = q("docker://" + options.image.removeprefix("docker://"))
        if options.runtime == "enroot":
            pull = f"enroot import --output {q(target)} {source}"
        else:
            pull = f"{options.runtime} pull {q(target)} {source}"
        lines += [f"if [ ! -f {q(target)} ]; then", f"  {pull}", "fi"]
    lines.append(f'exec sbatch "$@" {q(str(options.deploy_dir / SCRIPT_NAME))}')
    return "\n".join(lines) + "\n"


def write_deployment(config: ExperimentConfig, options: SlurmOptions, keys_text: str) -> list[Path]:
    """``submit.sh`` and the sbatch script (executable), config.json and the keys (owner-only)."""
    from distributed.deploy.manifests import write_private

    out = options.deploy_dir
    out.mkdir(parents=True, exist_ok=True)
    script, submit = out / SCRIPT_NAME, out / SUBMIT_NAME
    script.write_text(build_script(config, options))
    submit.write_text(submit_script(options))
    for path in (script, submit):
        path.chmod(0o755)
    run_folder.write_bytes(out / run_folder.CONFIG, config_json(config).encode(), sync=False)
    return [submit, script, out / run_folder.CONFIG, write_private(out / "keys", keys_text)]
