"""Where run.sh finds itself: each platform's variables, the user's own, and what cannot be right."""

import argparse
import os
import socket
from pathlib import Path

import pytest

from {{ cookiecutter.project_slug }} import cli, hardware, modelarts, platforms, roll_call, workspace
from {{ cookiecutter.project_slug }}.errors import PlatformError
from {{ cookiecutter.project_slug }}.platforms import Layout

# What each platform injects, for a job of 2 machines seen from machine 1 (host names included).
PYTORCHJOB = {  # training-operator v1, Master + 1 Worker, nprocPerNode 2
    "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "RANK": "1", "WORLD_SIZE": "4",
    "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2",
    "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456",
}  # fmt: skip
OLD_PYTORCHJOB = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "RANK": "1", "WORLD_SIZE": "2"}
PADDLEJOB = {
    "PADDLE_MASTER": "job-worker-0:36543",
    "PADDLE_NNODES": "2",
    "PADDLE_JOB_ID": "job",
    "HOSTNAME": "job-worker-1",
}
PADDLE_ENDPOINTS = {
    "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6170,10.0.0.1:6171,10.0.0.2:6170,10.0.0.2:6171",
    "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:6171", "PADDLE_TRAINER_ID": "3", "PADDLE_TRAINERS_NUM": "4",
}  # fmt: skip
MODELARTS = {
    "MA_NUM_HOSTS": "2",
    "VC_TASK_INDEX": "1",
    "VC_WORKER_HOSTS": "job-worker-0.job,job-worker-1.job",
    "MA_NUM_GPUS": "8",
}
SLURM_STEP = {
    "SLURM_JOB_ID": "4321", "SLURM_STEP_ID": "0", "SLURM_NNODES": "2", "SLURM_NTASKS": "2", "SLURM_NODEID": "1",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}  # fmt: skip


def decide(env: dict, gpus: int = 0, nodes: str = "multi", master_numbers_machines: bool = False, **launcher) -> Layout:
    return platforms.decide(env, gpus, nodes=nodes, master_numbers_machines=master_numbers_machines, **launcher)


@pytest.mark.parametrize(
    "env, platform, layout",
    [
        ({}, "none", (1, 0, "127.0.0.1", None, 1)),
        (PYTORCHJOB, "Kubeflow PyTorchJob", (2, 1, "job-master-0", 23456, 2)),
        (OLD_PYTORCHJOB, "Kubeflow PyTorchJob", (2, 1, "job-master-0", 23456, 1)),
        (PADDLEJOB, "Kubeflow PaddleJob", (2, 1, "job-worker-0", 36543, 1)),
        (PADDLE_ENDPOINTS, "PADDLE_TRAINER_ENDPOINTS", (2, 1, "10.0.0.1", 6170, 1)),
        (MODELARTS, "ModelArts", (2, 1, "job-worker-0.job", 29500, 8)),
        (SLURM_STEP, "SLURM", (2, 1, "gpu07", 24321, 1)),
    ],
    ids=["none", "pytorchjob", "pytorchjob-old", "paddlejob", "paddle-endpoints", "modelarts", "slurm"],
)
def test_each_platform_gives_machines_index_master_and_processes(env, platform, layout):
    found = decide(env)

    assert platform in found.platform
    assert (found.nnodes, found.node_rank, found.master_addr, found.master_port, found.nproc) == layout


def test_the_operators_world_size_counts_processes_and_is_not_taken_for_machines():
    assert decide(PYTORCHJOB).nnodes == 2  # WORLD_SIZE is 4: 2 pods x nprocPerNode 2


def test_processes_per_machine_come_from_the_user_then_the_platform_then_the_gpus():
    assert decide({}, gpus=4).nproc == 4
    assert decide(MODELARTS, gpus=4).nproc == 8
    assert decide({**MODELARTS, "MA_NUM_GPUS": "0"}, gpus=0).nproc == 1
    assert decide({**PYTORCHJOB, "PET_NPROC_PER_NODE": "auto"}, gpus=3).nproc == 3
    assert decide({**MODELARTS, "NPROC_PER_NODE": "2"}, gpus=4).nproc == 2


def test_a_users_nnodes_turns_detection_off():
    found = decide({**PYTORCHJOB, "NNODES": "3", "NODE_RANK": "2", "MASTER_ADDR": "10.0.0.9"})

    assert (found.platform, found.nnodes, found.node_rank, found.master_addr) == ("NNODES set by you", 3, 2, "10.0.0.9")
    assert found.master_port == 23456  # the MASTER_PORT in the environment


def test_each_other_variable_overrides_only_its_own_value():
    found = decide({**MODELARTS, "MASTER_PORT": "31000", "NODE_RANK": "0"})

    assert (found.platform, found.nnodes, found.node_rank, found.master_addr, found.master_port) == (
        "ModelArts", 2, 0, "job-worker-0.job", 31000,
    )  # fmt: skip


def test_the_kubeflow_operators_own_master_variables_do_not_stop_detection():
    found = decide(PYTORCHJOB)  # it sets MASTER_ADDR and MASTER_PORT beside PET_*

    assert found.platform.startswith("Kubeflow") and found.nnodes == 2


def test_a_paddlejob_pod_finds_its_index_in_its_name_or_leaves_it_to_paddles_master():
    assert decide({**PADDLEJOB, "HOSTNAME": "job-worker-0"}).node_rank == 0
    assert decide({**PADDLEJOB, "HOSTNAME": "job-worker-0", "POD_IP_DUMMY": "10.1.2.3"}).node_rank == 0
    unnamed = {**PADDLEJOB, "HOSTNAME": "somewhere"}
    assert decide(unnamed, master_numbers_machines=True).node_rank is None
    with pytest.raises(PlatformError, match="does not say which machine this is: set NODE_RANK"):
        decide(unnamed, master_numbers_machines=False)


def test_a_paddle_master_job_with_the_trainers_list_finds_its_index_in_it():
    ai_studio = {"PADDLE_MASTER": "10.0.0.1:6170", "PADDLE_NNODES": "2", **PADDLE_ENDPOINTS}

    assert decide(ai_studio).node_rank == 1  # PADDLE_CURRENT_ENDPOINT's host is the second machine
    one_trainer_each = {**ai_studio, "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6170,10.0.0.2:6170"}
    by_id = {**one_trainer_each, "PADDLE_CURRENT_ENDPOINT": "", "PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "2"}
    assert decide(by_id).node_rank == 1  # one trainer a machine: its trainer id


@pytest.mark.parametrize(
    "env, message",
    [
        ({"NNODES": "2", "NODE_RANK": "2"}, "NODE_RANK 2 is not below NNODES 2"),
        ({**MODELARTS, "VC_TASK_INDEX": "5"}, "NODE_RANK 5 is not below NNODES 2 (ModelArts)"),
        ({"NNODES": "two"}, "NNODES='two' is not a whole number"),
        ({"NPROC_PER_NODE": "0"}, "NPROC_PER_NODE='0' is not a whole number of 1 or more"),
        ({"NNODES": "3:2"}, "NNODES='3:2' is not a whole number of 1 or more, nor a range MIN:MAX"),
        ({"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"}, "outside srun"),
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "4294967291", "SLURM_NNODES": "2"}, "outside srun"),
        ({**SLURM_STEP, "SLURM_NTASKS": "4"}, "has 4 tasks on 2 machine(s)"),
        ({"MA_NUM_HOSTS": "2", "VC_TASK_INDEX": "0"}, "names no master"),
    ],
)
def test_values_that_cannot_be_right_stop_with_one_line(env, message):
    with pytest.raises(PlatformError) as error:
        decide(env)

    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_range_of_machines_is_an_elastic_job_numbered_by_its_rendezvous():
    found = decide({"NNODES": "1:3", "MASTER_ADDR": "10.0.0.1"}, framework="pytorch", launcher="torchrun")
    pod = decide({**PYTORCHJOB, "PET_NNODES": "1:2"}, framework="pytorch", launcher="torchrun")

    assert (found.min_nnodes, found.nnodes, found.node_rank) == (1, 3, None)
    assert (pod.min_nnodes, pod.nnodes) == (1, 2)
    assert decide({"NNODES": "2:2"}).min_nnodes is None  # not a range


@pytest.mark.parametrize(
    "framework, launcher, env, message",
    [
        ("pytorch", "spawn", {}, "runs with torchrun; this project was baked with launcher=spawn"),
        ("pytorch", "launch", {}, "runs with torchrun; this project was baked with launcher=launch"),
        ("paddle", "spawn", {}, "runs with Paddle's launch or fleetrun"),
        ("paddle", "launch", {}, "needs an etcd server that every machine reaches: set ETCD_ENDPOINT=HOST:PORT"),
    ],
)
def test_an_elastic_job_where_the_launcher_cannot_run_one_stops_with_one_line(framework, launcher, env, message):
    with pytest.raises(PlatformError) as error:
        decide({"NNODES": "1:2", **env}, framework=framework, launcher=launcher)

    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_global_batch_that_some_allowed_world_size_cannot_reach_is_refused_at_the_start():
    assert roll_call.batch_refusal(96, 8, 2, 1, 3) is None  # 16, 32 and 48 all divide 96
    refusal = roll_call.batch_refusal(64, 8, 2, 1, 3)

    assert "on 3 machine(s) (6 processes)" in refusal and "elastic job of 1 to 3 machines" in refusal


def test_the_batch_shell_error_says_to_use_srun_or_the_job_file():
    with pytest.raises(PlatformError, match="srun --ntasks-per-node=1 bash run.sh`, or submit slurm/train.sbatch"):
        decide({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "3"})


def test_a_one_machine_slurm_shell_is_this_machine_alone():
    assert decide({"SLURM_JOB_ID": "7", "SLURM_NNODES": "1"}).platform.startswith("none")


def test_a_one_machine_project_refuses_a_platform_of_several_machines():
    with pytest.raises(PlatformError, match="Kubeflow PyTorchJob/TrainJob says this job has 2 machines.*nodes=single"):
        decide(PYTORCHJOB, nodes="single")
    with pytest.raises(PlatformError) as error:
        decide({"NNODES": "2"}, nodes="single")
    assert str(error.value) == (
        "this project was baked for one machine (nodes=single); bake it again with nodes=multi to use NNODES=2"
    )
    assert decide({**PYTORCHJOB, "PET_NNODES": "1", "PET_NODE_RANK": "0"}, nodes="single").nnodes == 1


@pytest.mark.parametrize(
    "nodelist, first",
    [("gpu07", "gpu07"), ("gpu[07-09,12],cpu1", "gpu07"), ("a1,b[2-3]", "a1"), ("r[1-2]-n[3-4]", "r1-n3")],
)
def test_the_master_is_the_first_host_of_a_slurm_host_list(nodelist, first):
    assert platforms.first_slurm_host(nodelist) == first


def test_a_host_name_is_resolved_and_waited_for_until_join_timeout(capsys):
    answers = iter([socket.gaierror("not yet"), socket.gaierror("not yet"), "10.0.0.5"])

    def lookup(name):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert hardware.resolve("job-master-0", 60, lookup=lookup, sleep=lambda s: None) == "10.0.0.5"
    assert hardware.resolve("10.0.0.7", 0, lookup=None) == "10.0.0.7"  # an address is not looked up
    assert "waiting for the master's host name job-master-0" in capsys.readouterr().err


def test_a_host_name_that_never_resolves_ends_in_one_line():
    def lookup(name):
        raise socket.gaierror("unknown")

    with pytest.raises(PlatformError, match="'nowhere.invalid' did not resolve within JOIN_TIMEOUT=0 s"):
        hardware.resolve("nowhere.invalid", 0, lookup=lookup, sleep=lambda s: None)


def test_on_one_machine_the_found_line_says_its_launcher_picks_a_free_port_whatever_master_port_says():
    found = decide({"MASTER_PORT": "29556"})

    assert found.master_port is None
    assert "master 127.0.0.1, a free port;" in platforms.describe(found, "127.0.0.1", "/out")


def test_the_found_line_names_platform_machine_processes_and_master():
    line = platforms.describe(decide(PYTORCHJOB), "10.0.0.5", "/out")

    assert line == (
        "platform: Kubeflow PyTorchJob/TrainJob; machine 1 of 2; 2 processes per machine; "
        "master job-master-0 (10.0.0.5), port 23456; outputs in /out"
    )


# ----------------------------------------------------------------------------- output folder, data


def test_the_output_folder_is_the_flag_then_train_url_then_the_ai_studio_workspace(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLEJOB_WORKSPACE", str(tmp_path / "workspace"))
    assert workspace.output_dir(None, None) == str(workspace.PROJECT_ROOT / "output")  # no such workspace

    (tmp_path / "workspace").mkdir()
    assert workspace.output_dir(None, None) == str(tmp_path / "workspace" / "output")
    assert workspace.output_dir(None, "/train_url") == "/train_url"
    assert workspace.output_dir("mine", "/train_url") == "mine"
    assert cli.parse_args([]).output_dir == str(tmp_path / "workspace" / "output")


def test_data_url_is_a_folder_of_data_or_a_folder_holding_the_archive(tmp_path):
    (tmp_path / "data" / "train").mkdir(parents=True)
    args = cli.parse_args(["--data_url", str(tmp_path / "data")])
    assert (args.data_dir, args.dataset_zip) == (str(tmp_path / "data"), None)

    (tmp_path / "zipped").mkdir()
    (tmp_path / "zipped" / "pets.zip").write_bytes(b"")
    args = cli.parse_args(
        ["--data_url", str(tmp_path / "zipped"), "--train_url", str(tmp_path / "out"), "--no-synthetic"]
    )
    assert (args.dataset_zip, args.data_dir) == (
        str(tmp_path / "zipped" / "pets.zip"),
        str(tmp_path / "zipped" / "pets"),
    )
    assert args.output_dir == str(tmp_path / "out")


def test_a_data_url_with_several_archives_asks_which_one(tmp_path, capsys):
    for name in ("a.zip", "b.tar.gz"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(SystemExit):
        cli.parse_args(["--data_url", str(tmp_path)])
    assert "holds several archives (a.zip, b.tar.gz)" in capsys.readouterr().err


def test_an_archive_in_a_folder_that_cannot_be_written_is_extracted_elsewhere_with_a_line(
    tmp_path, monkeypatch, capsys
):
    read_only = tmp_path / "datasets" / "123"
    read_only.mkdir(parents=True)
    monkeypatch.setattr(workspace, "can_write", lambda folder: read_only not in (folder, *folder.parents))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("PADDLE_LOCAL_RANK", raising=False)

    args = cli.parse_args(["--dataset-zip", str(read_only / "pets.zip"), "--no-synthetic"])

    assert Path(args.data_dir) == workspace.PROJECT_ROOT / "data" / "pets"
    assert (
        f"{read_only} cannot be written: the dataset archive is extracted into {args.data_dir}"
        in capsys.readouterr().out
    )


def test_a_relative_dataset_path_is_found_in_the_ai_studio_workspace(tmp_path, monkeypatch):
    archive = tmp_path / "train_data" / "datasets" / "123" / "pets.zip"
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"")
    monkeypatch.setenv("PADDLEJOB_WORKSPACE", str(tmp_path))
    monkeypatch.chdir(workspace.PROJECT_ROOT)

    args = cli.parse_args(["--dataset-zip", "train_data/datasets/123/pets.zip", "--no-synthetic"])

    assert args.dataset_zip == str(archive)


# ----------------------------------------------------------------------------- ModelArts: one command per machine


def test_under_a_launcher_or_run_sh_the_modelarts_machine_flags_are_ignored():
    assert not modelarts.under_launcher({})
    assert modelarts.under_launcher({"STARTED_BY_RUN_SH": "1"})
    assert modelarts.under_launcher({"LOCAL_RANK": "0"})
    assert modelarts.under_launcher({"PADDLE_LOCAL_RANK": "0"})
    assert modelarts.under_launcher({"SLURM_NTASKS": "8"})


def test_init_method_is_tcp_host_port():
    assert modelarts.parse_init_method("tcp://job-worker-0:6666") == ("job-worker-0", 6666)
    with pytest.raises(PlatformError, match="is not tcp://HOST:PORT"):
        modelarts.parse_init_method("env://")


def test_the_machine_command_drops_the_machine_flags_and_makes_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["--epochs", "3", "--init_method=tcp://h:1", "--rank", "1", "--world_size", "2", "--train_url", "out"]
    args = cli.parse_args(argv)

    machine = modelarts.machine_argv(argv, args)

    assert machine[:4] == ["--epochs", "3", "--train_url", "out"]
    assert machine[machine.index("--output-dir") + 1] == str(tmp_path / "out")
    assert not {"--init_method", "--rank", "--world_size"} & set(machine)
    again = cli.parse_args(machine)
    assert (again.output_dir, again.data_dir, again.dataset_zip) == (
        str(tmp_path / "out"), os.path.abspath(args.data_dir), args.dataset_zip and os.path.abspath(args.dataset_zip),
    )  # fmt: skip


def test_the_machine_command_passes_a_config_on_with_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text("epochs: 4\n", encoding="utf-8")
    argv = ["--config", "run.yaml", "--init_method=tcp://h:1", "--rank", "1", "--world_size", "2"]

    machine = modelarts.machine_argv(argv, cli.parse_args(argv))

    assert machine[machine.index("--config", 2) + 1] == str(tmp_path / "run.yaml")
    monkeypatch.chdir("/")  # run.sh starts in the project folder
    assert cli.parse_args(machine).epochs == 4
    monkeypatch.setattr(os, "execvpe", lambda *a: pytest.fail("run.py must not become run.sh"))
    modelarts.start_this_machine(argparse.Namespace(init_method=None))
    monkeypatch.setenv("LOCAL_RANK", "0")
    modelarts.start_this_machine(argparse.Namespace(init_method="tcp://h:1"))


def test_with_init_method_and_no_launcher_run_py_becomes_run_sh_for_this_machine(monkeypatch):
    for name in ("STARTED_BY_RUN_SH", "LOCAL_RANK", "PADDLE_LOCAL_RANK", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    started = {}
    monkeypatch.setattr(os, "execvpe", lambda file, argv, env: started.update(argv=argv, env=env))
    argv = ["--init_method", "tcp://job-worker-0:6666", "--rank", "1", "--world_size", "2", "--epochs", "1"]

    modelarts.start_this_machine(cli.parse_args(argv), argv)

    assert started["argv"][:3] == ["bash", str(workspace.PROJECT_ROOT / "run.sh"), "--epochs"]
    env = started["env"]
    assert (env["NNODES"], env["NODE_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == (
        "2",
        "1",
        "job-worker-0",
        "6666",
    )
    assert platforms.decide(env, 0, nodes="multi").platform == "ModelArts (run.py --init_method --rank --world_size)"
