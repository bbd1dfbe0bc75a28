"""run.sh --check's verdicts, given other machines' answers than this one's (the whole check of two machines runs
in the template's tests)."""

import socket

from {{ cookiecutter.project_slug }} import hardware, preflight
from {{ cookiecutter.project_slug }}.preflight import SHM_PER_WORKER, MiB


def report(**changes) -> dict:
    """A machine with nothing wrong, as preflight.machine_report() describes one."""
    return {
        "host": "gpu07", "build": "torch 2.13.0 (CUDA 13.0)", "processes": 8, "code": "265af5316094",
        "data": "the archive /data/set.zip", "data_path": "/data/set.zip", "output": "/shared/out",
        "unwritable": None, "sees_token": True, "free": 100 * 2**30, "need": 2**30, "workers": 64,
        "shm": 64 * SHM_PER_WORKER, "untracked": None, "lines": [],
    } | changes  # fmt: skip


def test_machines_that_agree_have_no_problem():
    assert preflight.machine_problems([report(), report(host="gpu08")]) == []


def test_each_difference_from_machine_0_is_its_own_line_naming_the_machine_and_the_fix():
    other = report(
        host="gpu08", build="torch 2.11.0 (CUDA 12.8)", processes=4, code="0123456789ab", data=None,
        sees_token=False, output="/home/me/out", shm=64 * MiB,
    )  # fmt: skip

    problems = preflight.machine_problems([report(), other])

    assert len(problems) == 6
    assert all(problem.startswith("machine 1 (gpu08)") for problem in problems)
    fixes = ["install the same", "NPROC_PER_NODE", "copy the same project", "--data-dir", "mounts", "--shm-size"]
    assert all(fix in problem for fix, problem in zip(fixes, problems, strict=True))


def test_an_output_folder_machine_1_cannot_write_is_said_rather_than_that_it_differs():
    [problem] = preflight.machine_problems([report(), report(unwritable="Permission denied", sees_token=False)])

    assert "cannot write the output folder /shared/out (Permission denied)" in problem


def test_a_tracker_machine_0_has_not_installed_is_a_problem_naming_its_pip_install():
    [problem] = preflight.machine_problems([report(untracked="mlflow"), report(host="gpu08")])

    assert problem.startswith("machine 0 (gpu07): --tracking mlflow needs its package: pip install mlflow")


def test_a_disk_without_room_for_the_next_checkpoint_is_a_problem():
    [problem] = preflight.machine_problems([report(free=100 * MiB, need=300 * MiB)])

    assert "100 MiB free, the next checkpoint needs about 300 MiB" in problem


def test_a_clock_more_than_five_seconds_off_is_a_problem_and_a_wrong_sum_too():
    timings = [(0.1, 4.0, 1000.0), (0.1, 4.0, 1000.0), (0.1, 4.0, 1007.5), (0.1, 3.0, 1007.5)]

    problems = preflight.job_problems(timings, world_size=4, machines=2)

    assert "summed to [3.0, 4.0], not 4" in problems[0]
    assert problems[1].startswith("machine 1's clock is +7.5 s off machine 0's")


def test_the_all_reduce_line_gives_the_bus_bandwidth_of_its_slowest_rank():
    class Env:
        world_size, on_gpu = 2, False

    line = preflight.all_reduce_line([(0.064, 2.0, 0.0), (0.128, 2.0, 0.0)], Env())

    # 64 MiB, of which each rank sends and receives 2 (n - 1) / n, in 0.128 s
    assert line == f"64 MiB over 2 rank(s) on gloo in 0.128 s, {64 * MiB / 0.128 / 1e9:.2f} GB/s bus bandwidth"


def test_the_interface_to_the_master_is_named_and_a_variable_is_asked_for_only_where_the_default_differs():
    said, variable = hardware.interface_advice("127.0.0.1", 29500, on_gpu=False, env={})
    assert said.startswith("lo (127.0.0.1) reaches the master") and variable is None

    said, variable = hardware.interface_advice("127.0.0.1", 29500, on_gpu=True, env={"NCCL_SOCKET_IFNAME": "lo"})
    assert said.endswith("NCCL_SOCKET_IFNAME=lo is set") and variable is None


def test_where_gloo_would_bind_elsewhere_than_the_way_to_the_master_the_line_names_the_variable(monkeypatch):
    monkeypatch.setattr(hardware, "route_to", lambda master, port: "127.0.0.1")  # this machine's lo
    monkeypatch.setattr(hardware, "gloo_default_address", lambda: None)  # its host name resolves to nothing

    said, variable = hardware.interface_advice("10.0.0.1", 29500, on_gpu=False, env={})

    assert said == "lo (127.0.0.1) reaches the master 10.0.0.1, but GLOO_SOCKET_IFNAME unset would take the loopback"
    assert variable == "GLOO_SOCKET_IFNAME=lo"


def test_the_data_is_found_as_a_folder_or_as_the_archive_beside_it(tmp_path):
    assert preflight.data_present(str(tmp_path / "set"), None) is None
    (tmp_path / "set.zip").write_bytes(b"PK")
    assert preflight.data_present(str(tmp_path / "set"), None) == f"the archive {tmp_path / 'set.zip'}"
    assert preflight.data_present(None, str(tmp_path / "other.zip")) is None


def test_the_last_checkpoint_counts_every_file_of_it(tmp_path):
    assert preflight.checkpoint_bytes(tmp_path / "checkpoints") == 0
    (tmp_path / "checkpoints" / "last").mkdir(parents=True)
    (tmp_path / "checkpoints" / "last" / "rank0.distcp").write_bytes(b"x" * 100)
    (tmp_path / "checkpoints" / "last.pdopt").write_bytes(b"x" * 20)
    (tmp_path / "checkpoints" / "best.pt").write_bytes(b"x" * 1000)

    assert preflight.checkpoint_bytes(tmp_path / "checkpoints") == 120


def test_a_port_that_nothing_listens_on_is_given_up_after_the_wait_and_one_that_listens_answers():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert not hardware.wait_for_port("127.0.0.1", port, wait_s=0.5)
        server.listen()
        assert hardware.wait_for_port("127.0.0.1", port, wait_s=0.5)
