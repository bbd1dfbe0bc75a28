"""Platforms: run.sh finds SLURM, Kubernetes, ModelArts and AI Studio from their variables; k8s/train.yaml.

No scheduler runs here: each "machine" is a copy of the baked project started on loopback with exactly the
variables its platform injects (host names included). The fast tier asks run.sh what it would start
(DRY_RUN=1); the slow tier trains and checks that the machines made one job of the right world size.
"""

import fcntl
import json
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import tool_env

MULTI_LAUNCHERS = [
    {"framework": "pytorch", "launcher": "torchrun"},
    {"framework": "pytorch", "launcher": "launch"},
    {"framework": "pytorch", "launcher": "spawn"},
    {"framework": "paddle", "launcher": "launch"},
    {"framework": "paddle", "launcher": "fleetrun"},
]
ALL_LAUNCHERS = MULTI_LAUNCHERS + [{"framework": "paddle", "launcher": "spawn"}]
# Variables of the machine the tests run on that would tell run.sh another story.
PLATFORM_VARIABLES = (
    "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE", "RANK", "WORLD_SIZE", "LOCAL_RANK",
    "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NTASKS", "PADDLE_MASTER", "PADDLE_NNODES", "PADDLE_TRAINER_ENDPOINTS",
    "MA_NUM_HOSTS", "VC_WORKER_HOSTS", "PADDLEJOB_WORKSPACE", "PET_NNODES", "JOIN_TIMEOUT",
)  # fmt: skip
TRAIN_SIZE = 1437


def ids(answers: dict) -> str:
    return "-".join(answers.values())


def platform_env(**variables: str) -> dict:
    """This machine's environment without platform variables, then `variables`: what a platform's pod sees."""
    env = {key: value for key, value in tool_env().items() if key not in PLATFORM_VARIABLES}
    env.update(variables)
    return env


def free_port(low: int = 0) -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", low))
        return sock.getsockname()[1]


def dry_run(project: Path, *args: str, **variables: str) -> subprocess.CompletedProcess:
    env = platform_env(DRY_RUN="1", **variables)
    return subprocess.run(["bash", "run.sh", *args], cwd=project, env=env, capture_output=True, text=True, timeout=60)


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


def pytorchjob_env(rank: int, pods: int, nproc: int, port: int, master: str = "localhost") -> dict:
    """What training-operator v1 gives pod `rank` of a PyTorchJob (Master + Workers) with nprocPerNode `nproc`."""
    return {
        "MASTER_ADDR": master, "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(pods * nproc),
        "PET_NNODES": str(pods), "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": str(nproc),
        "PET_MASTER_ADDR": master, "PET_MASTER_PORT": str(port), "PYTHONUNBUFFERED": "0",
    }  # fmt: skip


def paddlejob_env(index: int, pods: int, port: int, job: str = "job", master: str = "localhost") -> dict:
    """What training-operator v1 gives worker `index` of a collective PaddleJob: worker 0 its own pod IP as the
    master, the others worker 0's name; the pod's name is the host name."""
    env = {
        "PADDLE_NNODES": str(pods),
        "PADDLE_JOB_ID": job,
        "HOSTNAME": f"{job}-worker-{index}",
        "PYTHONUNBUFFERED": "0",
    }
    if index == 0:
        env.update(POD_IP_DUMMY="127.0.0.1", PADDLE_MASTER=f"127.0.0.1:{port}")
    else:
        env.update(PADDLE_MASTER=f"{master}:{port}")
    return env


def modelarts_env(index: int, hosts: int) -> dict:
    """What a ModelArts training job gives machine `index` (no GPU): worker host names, the first the master."""
    names = ",".join(["localhost"] + [f"modelarts-job-worker-{i}.modelarts-job" for i in range(1, hosts)])
    return {
        "MA_NUM_HOSTS": str(hosts),
        "VC_WORKER_NUM": str(hosts),
        "VC_TASK_INDEX": str(index),
        "VC_WORKER_HOSTS": names,
        "MA_NUM_GPUS": "0",
    }


# ----------------------------------------------------------------------------- k8s/train.yaml


def job_file(project: Path) -> dict:
    return yaml.safe_load((project / "k8s" / "train.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("framework", ["pytorch", "paddle"])
@pytest.mark.parametrize("nodes", ["multi", "single"])
def test_the_kubernetes_job_file_has_what_the_operator_needs(bake, framework, nodes):
    project = bake(framework=framework, nodes=nodes, dataset="synthetic")
    job = job_file(project)
    text = (project / "k8s" / "train.yaml").read_text(encoding="utf-8")

    assert job["apiVersion"] == "kubeflow.org/v1"
    assert job["kind"] == ("PyTorchJob" if framework == "pytorch" else "PaddleJob")
    assert job["spec"]["runPolicy"]["backoffLimit"] >= 1
    specs = job["spec"]["pytorchReplicaSpecs" if framework == "pytorch" else "paddleReplicaSpecs"]
    if framework == "pytorch":
        assert isinstance(job["spec"]["nprocPerNode"], str)  # the operator's field is a string: "auto" or a number
        assert specs["Master"]["replicas"] == 1
    else:
        assert set(specs) == {"Worker"}  # collective mode: worker 0 hosts the master
    assert sum(spec["replicas"] for spec in specs.values()) == (2 if nodes == "multi" else 1)
    for spec in specs.values():
        assert spec["restartPolicy"] == "ExitCode"  # retries 143 (preempted), not 1 (a user error)
        pod = spec["template"]["spec"]
        [container] = pod["containers"]
        assert container["name"] == framework  # "pytorch" / "paddle": the names the operators look for
        assert container["command"] == ["bash", "run.sh"]
        assert container["ports"][0]["name"] == ("pytorchjob-port" if framework == "pytorch" else "master")
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        claimed = [path for path, name in mounts.items() if "persistentVolumeClaim" in volumes[name]]
        output = container["args"][container["args"].index("--output-dir") + 1]
        assert any(output.startswith(path + "/") for path in claimed), "outputs must be on the volume to resume"
    for field in (
        "image:",
        "replicas:",
        "nvidia.com/gpu",
        "nprocPerNode:" if framework == "pytorch" else "NPROC_PER_NODE",
    ):
        assert any(field in line and "EDIT" in line for line in text.splitlines()) or (
            field == "replicas:" and nodes == "single"
        ), f"{field} is not marked EDIT"


# What a user uncomments for an elastic job: the YAML lines of the commented block, not the comments around them.
ELASTIC_LINE = re.compile(
    r"^(\s*)# (?=(?:elasticPolicy|env):|\s*(?:minReplicas|maxReplicas|rdzvBackend|maxRestarts|value):"
    r"|\s*- name: (?:NNODES|ETCD_ENDPOINT|JOB_ID|MAX_RESTARTS)\b)",
    re.MULTILINE,
)


@pytest.mark.parametrize("answers", MULTI_LAUNCHERS, ids=ids)
def test_the_kubernetes_job_file_of_an_elastic_job_is_the_commented_block_uncommented(bake, answers):
    project = bake(nodes="multi", dataset="synthetic", **answers)
    text, uncommented = ELASTIC_LINE.subn(r"\1", (project / "k8s" / "train.yaml").read_text(encoding="utf-8"))
    pytorch = answers["framework"] == "pytorch"
    if answers["launcher"] == "spawn" or (pytorch and answers["launcher"] == "launch"):
        assert uncommented == 0  # a range stops these launchers in one line: no block to offer
        return
    job = yaml.safe_load(text)
    specs = job["spec"]["pytorchReplicaSpecs" if pytorch else "paddleReplicaSpecs"]
    containers = {role: spec["template"]["spec"]["containers"][0] for role, spec in specs.items()}
    envs = {role: {item["name"]: item["value"] for item in container["env"]} for role, container in containers.items()}
    name = job["metadata"]["name"]
    if pytorch:
        assert uncommented == 5 + 5 * 2  # "the five elasticPolicy lines", "these five lines" in each container
        policy = job["spec"]["elasticPolicy"]
        assert policy == {"minReplicas": 1, "maxReplicas": 2, "rdzvBackend": "c10d", "maxRestarts": 3}
        assert policy["maxReplicas"] == sum(spec["replicas"] for spec in specs.values())
        assert envs == {role: {"JOB_ID": name, "MAX_RESTARTS": str(policy["maxRestarts"])} for role in specs}
        # What the operator then gives the Worker pod (a range in PET_NNODES; PET_MAX_RESTARTS, PET_RDZV_* that
        # run.sh leaves aside), and the container's own env: torchrun's elastic command.
        port = free_port()
        pod = pytorchjob_env(rank=1, pods=2, nproc=1, port=port)
        pod.update(PET_NNODES="1:2", PET_MAX_RESTARTS="3", PET_RDZV_BACKEND="c10d")
        pod.update(PET_RDZV_ENDPOINT=f"{name}-worker-0:{port}", **envs["Worker"])
        result = dry_run(project, **pod)
        assert result.returncode == 0, result.stderr
        found, command = result.stdout.strip().splitlines()
        assert f"machine (numbered by the rendezvous) of 1 to 2 (elastic, job {name})" in found
        for flag in ("--nnodes=1:2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={name}"):
            assert flag in command
        assert "--max-restarts=3" in command
    else:
        assert uncommented == 8  # "the eight lines below"
        assert "elasticPolicy" not in job["spec"]  # training-operator v1 does nothing with a PaddleJob's
        assert envs["Worker"] == {
            "NPROC_PER_NODE": "1", "NNODES": "1:2", "ETCD_ENDPOINT": "etcd:2379", "JOB_ID": name, "MAX_RESTARTS": "3",
        }  # fmt: skip
        assert specs["Worker"]["replicas"] == int(envs["Worker"]["NNODES"].partition(":")[2])
        pod = paddlejob_env(index=1, pods=2, port=free_port(), job=name)
        pod.update(envs["Worker"], ETCD_ENDPOINT="127.0.0.1:2379")
        result = dry_run(project, **pod)
        assert result.returncode == 0, result.stderr
        found = result.stdout.splitlines()[0]
        assert f"of 1 to 2 (elastic, job {name}); 1 process per machine; master etcd 127.0.0.1:2379" in found


# ----------------------------------------------------------------------------- detection, through run.sh (fast)


@pytest.mark.parametrize("answers", MULTI_LAUNCHERS, ids=ids)
def test_every_launcher_starts_the_pytorchjob_layout_with_the_master_resolved(bake, answers):
    project = bake(nodes="multi", dataset="synthetic", **answers)

    result = dry_run(project, **pytorchjob_env(rank=1, pods=2, nproc=2, port=23456))

    assert result.returncode == 0, result.stderr
    found, command = result.stdout.strip().splitlines()
    assert found.startswith("platform: Kubeflow PyTorchJob/TrainJob; machine 1 of 2; 2 processes per machine; ")
    assert "master localhost (127.0.0.1), port 23456" in found
    if answers["launcher"] != "spawn":  # spawn: run.py reads the exported variables
        assert "127.0.0.1" in command and "23456" in command and "localhost" not in command


@pytest.mark.parametrize("answers", ALL_LAUNCHERS, ids=ids)
def test_every_launcher_of_a_one_machine_project_says_what_it_found(bake, answers):
    project = bake(dataset="synthetic", **answers)

    result = dry_run(project, NPROC_PER_NODE="2")

    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.splitlines()[0] == (
        f"platform: none (this machine alone); machine 0 of 1; 2 processes per machine; master 127.0.0.1, "
        f"a free port; outputs in {project / 'output'}"
    )


@pytest.mark.parametrize("answers", ALL_LAUNCHERS, ids=ids)
def test_every_launcher_refuses_a_folder_that_a_running_job_holds_in_one_line(bake, answers):
    project = bake(dataset="synthetic", **answers)
    output = project / "output"
    output.mkdir()
    with open(output / ".job.lock", "w") as held:  # as a running job's rank 0 holds the folder it trains in
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("host gpu-7, process 4242")
        held.flush()

        result = dry_run(project, NPROC_PER_NODE="2", JOB_LOCK_WAIT="0")

    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: output folder {output} is in use by another job (host gpu-7, process 4242): wait for it to end or "
        "stop it, or give this job another --output-dir"
    ]
    assert [path.name for path in output.iterdir()] == [".job.lock"]


@pytest.mark.parametrize(
    "variables, message",
    [
        ({"NNODES": "2", "NODE_RANK": "2"}, "NODE_RANK 2 is not below NNODES 2"),
        ({"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "nowhere.invalid", "JOIN_TIMEOUT": "1"}, "did not resolve"),
        ({"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"}, "outside srun"),
        (
            {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_NNODES": "2", "SLURM_NTASKS": "4", "SLURM_NODEID": "0"},
            "4 tasks on 2 machine(s)",
        ),
        ({"PADDLE_MASTER": "localhost:1234", "PADDLE_NNODES": "2"}, "set NODE_RANK"),  # a torch project on a PaddleJob
    ],
    ids=["rank-too-big", "master-never-resolves", "slurm-batch-shell", "slurm-tasks-per-machine", "no-rank"],
)
def test_values_that_cannot_be_right_end_in_one_error_line(bake, variables, message):
    project = bake(nodes="multi", dataset="synthetic")

    result = dry_run(project, **variables)

    assert result.returncode == 1
    assert len(error_lines(result)) == 1 and message in error_lines(result)[0], result.stderr
    assert result.stdout == ""


def test_a_one_machine_project_refuses_a_platform_of_several_machines(bake):
    project = bake(framework="paddle", dataset="synthetic")

    result = dry_run(project, **paddlejob_env(index=1, pods=2, port=36543))

    assert result.returncode == 1
    [error] = error_lines(result)
    assert "Kubeflow PaddleJob says this job has 2 machines" in error and "nodes=single" in error


def test_a_paddlejob_without_pod_names_lets_paddles_master_number_the_machines(bake):
    project = bake(framework="paddle", nodes="multi", dataset="synthetic")

    result = dry_run(project, PADDLE_MASTER="localhost:36543", PADDLE_NNODES="2", PADDLE_JOB_ID="job")

    assert result.returncode == 0, result.stderr
    found, command = result.stdout.strip().splitlines()
    assert "machine (numbered by the master) of 2" in found
    assert "'--master' '127.0.0.1:36543' '--nnodes' '2'" in command and "--rank" not in command


def test_ai_studio_outputs_and_launcher_logs_go_to_the_workspace(bake, tmp_path):
    project = bake(framework="paddle", dataset="synthetic")
    (tmp_path / "workspace").mkdir()

    result = dry_run(project, PADDLEJOB_WORKSPACE=str(tmp_path / "workspace"))

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].endswith(f"outputs in {tmp_path / 'workspace' / 'output'}")
    assert f"'--log_dir' '{tmp_path / 'workspace' / 'output' / 'launch-logs'}'" in result.stdout


def test_predict_sh_keeps_the_launchers_logs_in_the_temporary_folder_not_beside_the_predictions(bake, tmp_path):
    project = bake(framework="paddle", dataset="synthetic")
    output = tmp_path / "submission" / "submission.csv"
    (tmp_path / "tmp").mkdir()
    env = platform_env(DRY_RUN="1", TMPDIR=str(tmp_path / "tmp"))

    result = subprocess.run(["bash", "predict.sh", "--input", "test.zip", "--output", str(output)], cwd=project,
                            env=env, capture_output=True, text=True, timeout=60)  # fmt: skip

    assert result.returncode == 0, result.stderr
    [log_dir] = re.findall(r"'--log_dir' '([^']+)'", result.stdout)
    assert Path(log_dir).parent == tmp_path / "tmp" and Path(log_dir).name.startswith("predict-logs-")


# ----------------------------------------------------------------------------- training on loopback (slow)


def start_machines(projects: list[Path], envs: list[dict], command: list[str]) -> list[str]:
    """Start `command` in each project copy with its environment, together; their outputs once all have ended."""
    machines = [
        subprocess.Popen(command, cwd=project, env=platform_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for project, env in zip(projects, envs, strict=True)
    ]  # fmt: skip
    outputs = [machine.communicate(timeout=400)[0] for machine in machines]
    assert [machine.returncode for machine in machines] == [0] * len(machines), "\n".join(o[-3000:] for o in outputs)
    return outputs


def machine_copies(project: Path, tmp_path: Path, count: int = 2) -> list[Path]:
    copies = [project]
    for index in range(1, count):
        shutil.copytree(project, tmp_path / f"machine{index}")
        copies.append(tmp_path / f"machine{index}")
    return copies


def read_metrics(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow
def test_a_pytorchjob_of_two_pods_with_two_processes_each_trains_as_one_job_of_four(bake, tmp_path):
    project = bake(nodes="multi", dataset="synthetic")
    [container] = job_file(project)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    command = container["command"] + ["--epochs", "1", "--output-dir", "out"]  # the job file's, on a local folder
    port = free_port()

    outputs = start_machines(
        machine_copies(project, tmp_path),
        [pytorchjob_env(rank, pods=2, nproc=2, port=port) for rank in (0, 1)],
        command,
    )

    assert outputs[1].startswith("platform: Kubeflow PyTorchJob/TrainJob; machine 1 of 2; 2 processes per machine")
    [record] = read_metrics(project / "out")
    assert record["world_size"] == 4 and record["train_samples"] == 2048


@pytest.mark.slow
def test_a_paddlejob_of_two_pods_trains_as_one_job(bake, tmp_path):
    project = bake(framework="paddle", nodes="multi", dataset="synthetic")
    [container] = job_file(project)["spec"]["paddleReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    pod_env = {item["name"]: item["value"] for item in container["env"]}  # NPROC_PER_NODE, as the job file sets it
    port = free_port()

    outputs = start_machines(
        machine_copies(project, tmp_path),
        [{**pod_env, **paddlejob_env(index, pods=2, port=port)} for index in (0, 1)],
        container["command"] + ["--epochs", "1", "--output-dir", "out"],
    )

    assert outputs[1].startswith(
        "platform: Kubeflow PaddleJob; machine 1 of 2; 1 process per machine; master localhost"
    )
    [record] = read_metrics(project / "out")
    assert record["world_size"] == 2 and record["train_samples"] == 2048


@pytest.mark.slow
def test_two_slurm_tasks_running_run_sh_start_two_processes_each_with_spawn(bake, tmp_path):
    project = bake(launcher="spawn", nodes="multi", dataset="synthetic")
    job_id = next(i for i in range(1000, 10000) if port_is_free(20000 + i))  # run.sh's port: 20000 + job id % 10000

    def task(node: int) -> dict:  # what srun --ntasks-per-node=1 gives each task
        return {
            "SLURM_JOB_ID": str(job_id), "SLURM_STEP_ID": "0", "SLURM_NNODES": "2", "SLURM_NTASKS": "2",
            "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": str(node),
            "SLURM_PROCID": str(node), "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "localhost,slurm-node-2",
            "NPROC_PER_NODE": "2",
        }  # fmt: skip

    outputs = start_machines(
        machine_copies(project, tmp_path),
        [task(0), task(1)],
        ["bash", "run.sh", "--epochs", "1", "--output-dir", "out"],
    )

    assert f"machine 0 of 2; 2 processes per machine; master localhost (127.0.0.1), port {20000 + job_id}" in outputs[0]
    [record] = read_metrics(project / "out")
    assert record["world_size"] == 4  # not 2: each task started its machine's processes


def port_is_free(port: int) -> bool:
    try:
        free_port(port)
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_modelarts_machines_started_by_run_sh_train_as_one_job_with_data_url_and_train_url(bake, tmp_path):
    project = bake(launcher="spawn", nodes="multi")
    data_url = tmp_path / "inputs" / "data_url_0"
    data_url.mkdir(parents=True)
    shutil.copy(project / "data" / "digits.zip", data_url)
    port = free_port()

    def machine(index: int) -> dict:
        return {**modelarts_env(index, hosts=2), "MASTER_PORT": str(port)}

    args = ["--epochs", "1", "--data_url", str(data_url)]
    outputs = start_machines(
        machine_copies(project, tmp_path),
        [machine(0), machine(1)],
        ["bash", "run.sh", *args, "--train_url", str(tmp_path / "outputs" / "train_url_0")],
    )

    assert "platform: ModelArts; machine 1 of 2; 1 process per machine; master localhost (127.0.0.1)" in outputs[1]
    [record] = read_metrics(tmp_path / "outputs" / "train_url_0")
    assert record["world_size"] == 2 and record["train_samples"] == TRAIN_SIZE


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["pytorch", "paddle"])
def test_modelarts_python_run_py_with_init_method_rank_and_world_size_on_two_machines(bake, tmp_path, framework):
    project = bake(framework=framework, nodes="multi")
    data_url = tmp_path / "data_url"
    data_url.mkdir()
    shutil.copy(project / "data" / "digits.zip", data_url)
    port = free_port()
    copies = machine_copies(project, tmp_path)

    outputs = start_seed_004(copies, data_url, port)

    assert all("1 process per machine" in output for output in outputs)
    [record] = read_metrics(copies[0] / "train_url")  # relative to where python run.py started
    assert record["world_size"] == 2 and record["train_samples"] == TRAIN_SIZE
    assert not (copies[1] / "train_url" / "metrics.jsonl").exists()


def start_seed_004(copies: list[Path], data_url: Path, port: int) -> list[str]:
    """ModelArts's boot command, once per machine: `python run.py ... --init_method --rank R --world_size 2`."""
    machines = [
        subprocess.Popen(
            ["python", "run.py", "--data_url", str(data_url), "--train_url", "train_url", "--epochs", "1",
             "--init_method", f"tcp://127.0.0.1:{port}", "--rank", str(rank), "--world_size", "2"],
            cwd=project, env=platform_env(**modelarts_env(rank, hosts=2)), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )
        for rank, project in enumerate(copies)
    ]  # fmt: skip
    outputs = [machine.communicate(timeout=400)[0] for machine in machines]
    assert [machine.returncode for machine in machines] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    return outputs


@pytest.mark.slow
def test_ai_studio_trains_from_a_workspace_dataset_path_into_the_workspace_output_with_no_copy_of_the_environment(
    bake, tmp_path
):
    project = bake(framework="paddle")
    workspace = tmp_path / "workspace"
    dataset = workspace / "train_data" / "datasets" / "123"
    dataset.mkdir(parents=True)
    shutil.copy(project / "data" / "digits.zip", dataset)

    result = subprocess.run(
        ["bash", "run.sh", "--epochs", "1", "--dataset-zip", "train_data/datasets/123/digits.zip"], cwd=project,
        env=platform_env(PADDLEJOB_WORKSPACE=str(workspace), NPROC_PER_NODE="2"), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [record] = read_metrics(workspace / "output")
    assert record["world_size"] == 2 and record["train_samples"] == TRAIN_SIZE
    # The workers' logs, and the backups they read as they start: not paddle's envlog.N and the pod's log.
    left = {path.name for path in (workspace / "output" / "launch-logs").iterdir()}
    assert left == {"workerlog.0", "workerlog.1", "backup_env.0.json", "backup_env.1.json"}
    assert (workspace / "output" / "launch-logs").stat().st_mode & 0o777 == 0o700  # the backups: for this user only
    # paddle's ports: none that the kernel may give an outgoing connection before the worker binds it.
    backup = json.loads((workspace / "output" / "launch-logs" / "backup_env.0.json").read_text(encoding="utf-8"))
    first_outgoing = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert int(backup["PADDLE_MASTER"].rsplit(":", 1)[1]) < first_outgoing
    assert (dataset / "digits" / "train").is_dir()
    assert not (project / "output").exists()
