"""Checkpoints hold everything a resumed run needs, load safely, and never leave a broken file behind."""

import json
import logging
import math
import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from checkpointers import CPU, assert_same_weights, build_checkpointer, take_averaged_steps, take_steps
from conftest import acc_state, averaging, free_port, rank_results, run_sh, save_epoch, save_rank_result
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from {{ cookiecutter.project_slug }} import checkpoint, distributed, engine, fsdp
from {{ cookiecutter.project_slug }}.checkpoint import Checkpointer
from {{ cookiecutter.project_slug }}.distributed import DistEnv
from {{ cookiecutter.project_slug }}.errors import UserError
from {{ cookiecutter.project_slug }}.preemption import EpochProgress


def load(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def save_epochs_keeping_the_best_two(saver: Checkpointer, accuracies: list[float]) -> None:
    """Epochs 1, 2, ... of these accuracies, saved by a run of --keep-best 2."""
    saver.keep_best = 2
    for epoch, acc in enumerate(accuracies, start=1):
        take_steps(saver, 1)
        saver.end_epoch(epoch, {"loss": 1.0, "acc": acc})


def test_the_two_best_epochs_are_kept_and_listed_best_first_and_resume_auto_takes_the_last(tmp_path):
    saver = build_checkpointer(tmp_path)
    save_epochs_keeping_the_best_two(saver, [0.5, 0.7, 0.6, 0.4])

    top = json.loads((tmp_path / "top.json").read_text())
    assert top == [{"epoch": 2, "value": 0.7, "path": "epoch-2.pt"}, {"epoch": 3, "value": 0.6, "path": "epoch-3.pt"}]
    assert sorted(path.name for path in tmp_path.glob("*.pt")) == ["best.pt", "epoch-2.pt", "epoch-3.pt", "last.pt"]
    assert_same_weights(load(tmp_path / "epoch-2.pt")["model"], load(tmp_path / "best.pt")["model"])
    assert build_checkpointer(tmp_path).resume("auto").epochs_done == 4


def test_last_checkpoint_loads_with_weights_only_and_holds_the_training_state(tmp_path):
    saver = build_checkpointer(tmp_path)
    take_steps(saver)

    save_epoch(saver, 3, 0.5, False)

    state = load(tmp_path / "last.pt")
    saved = {"model", "optimizer", "scheduler", "scaler", "epoch", "best_metric", "best_mode", "best_value", "rng"}
    assert saved <= state.keys()
    assert state["epoch"] == 3
    assert (state["best_metric"], state["best_mode"], state["best_value"]) == ("acc", "max", 0.5)
    assert_same_weights(state["model"], saver.model.state_dict())
    assert state["optimizer"]["state"], "momentum buffers are missing"
    assert state["position"] == pytest.approx(0.3)  # take_steps()'s three tenths of an epoch
    assert saver.last_path == tmp_path / "last.pt"


@pytest.fixture
def process_group_of_one(tmp_path):
    """A real (gloo) process group with this process as its only rank, so DDP can wrap a model."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_weights_saved_from_a_ddp_model_have_no_module_prefix(tmp_path, process_group_of_one):
    plain = nn.Linear(4, 3)
    saver = build_checkpointer(tmp_path / "checkpoints", model=DistributedDataParallel(plain))
    assert all(key.startswith("module.") for key in saver.model.state_dict())

    save_epoch(saver, 1, 0.1, False)

    weights = load(tmp_path / "checkpoints/last.pt")["model"]
    assert sorted(weights) == ["bias", "weight"]
    fresh = nn.Linear(4, 3)
    fresh.load_state_dict(weights)  # strict: the user's own model takes them as they are
    assert_same_weights(fresh.state_dict(), plain.state_dict())


def test_a_checkpoint_from_before_task_py_resumes_its_best_as_accuracy(tmp_path):
    save_epoch(build_checkpointer(tmp_path), 2, 0.75, True)
    older = {key: value for key, value in load(tmp_path / "last.pt").items() if not key.startswith("best_")}
    torch.save({**older, "best_acc": 0.75}, tmp_path / "last.pt")  # as the template wrote it before task.py

    resumed = build_checkpointer(tmp_path).resume("auto")

    assert resumed == acc_state(2, 0.75, EpochProgress())


def test_a_checkpoint_of_the_per_epoch_schedule_resumes_at_the_rate_of_its_epochs_done(tmp_path):
    save_epoch(build_checkpointer(tmp_path), 2, 0.75, True)
    saved = load(tmp_path / "last.pt")
    older = {key: value for key, value in saved.items() if key not in ("position", "warmup_epochs")}
    torch.save(older, tmp_path / "last.pt")  # as the template wrote it before the schedule stepped per step

    resumer = build_checkpointer(tmp_path)
    resumer.resume("auto")

    assert (resumer.schedule.position, resumer.schedule.warmup) == (2, 0.0)
    rate = resumer.optimizer.param_groups[0]["lr"]
    assert rate == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 2 / 10)))  # epoch 3's rate of a 10-epoch cosine


def test_a_resume_keeps_each_parameter_groups_own_rate_and_a_new_lr_scales_them_all(tmp_path):
    def saver_of_two_groups(lr: float) -> Checkpointer:  # a fine-tuning optimizer: the head at ten times the rate
        model = nn.Linear(4, 3)
        optimizer = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "lr": 10 * lr}], lr=lr)
        schedule = engine.cosine_schedule(optimizer, 10)
        return Checkpointer(tmp_path, CPU, model, optimizer, schedule, torch.amp.GradScaler("cpu", enabled=False))

    saved = saver_of_two_groups(0.1)
    saved.resume("none")
    take_steps(saved, 10)  # a tenth of an epoch a step
    saved.end_epoch(1, {"loss": 1.0, "acc": 0.5})

    def rates(built_lr: float, **resumed) -> list[float]:
        saver = saver_of_two_groups(built_lr)
        saver.resume("auto", **resumed)
        return [group["lr"] for group in saver.optimizer.param_groups]

    going_on = rates(0.1)
    assert going_on[1] == pytest.approx(10 * going_on[0])
    assert going_on[0] < 0.1  # (on the cosine, after epoch 1)
    assert rates(0.5, lr=0.5) == pytest.approx([0.5, 5.0])  # --lr on a resume: the rate from here on


def test_resume_from_an_explicit_path_loads_that_file(tmp_path):
    save_epoch(build_checkpointer(tmp_path / "old"), 5, 0.6, False)

    resumed = build_checkpointer(tmp_path / "new").resume(str(tmp_path / "old/last.pt"))
    assert resumed == acc_state(5, 0.6, EpochProgress(), stale_epochs=1)  # (epoch 5 was not the best)


def test_best_checkpoint_is_written_only_when_the_epoch_is_the_best(tmp_path):
    saver = build_checkpointer(tmp_path)

    save_epoch(saver, 1, 0.5, True)
    assert load(tmp_path / "best.pt")["epoch"] == 1

    save_epoch(saver, 2, 0.5, False)
    assert load(tmp_path / "best.pt")["epoch"] == 1
    assert load(tmp_path / "last.pt")["epoch"] == 2

    save_epoch(saver, 3, 0.8, True)
    assert load(tmp_path / "best.pt")["epoch"] == 3


def test_first_epoch_that_is_not_the_best_writes_no_best_checkpoint(tmp_path):
    save_epoch(build_checkpointer(tmp_path), 1, 0.0, False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_saving_leaves_no_temporary_file(tmp_path):
    saver = build_checkpointer(tmp_path)
    for epoch in (1, 2, 3):
        save_epoch(saver, epoch, 0.1 * epoch, True)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]


def test_a_full_disk_while_saving_keeps_the_previous_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    saver = build_checkpointer(tmp_path)
    save_epoch(saver, 1, 0.5, True)

    def disk_full(state, file):
        file.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(UserError, match="no space left in"):
        save_epoch(saver, 2, 0.9, True)
    monkeypatch.undo()

    assert load(tmp_path / "last.pt")["epoch"] == 1
    assert load(tmp_path / "best.pt")["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]


def test_a_plain_state_dict_is_not_taken_for_a_checkpoint(tmp_path):
    torch.save(nn.Linear(4, 3).state_dict(), tmp_path / "weights.pt")

    with pytest.raises(UserError, match="not a checkpoint written by run.py"):
        build_checkpointer(tmp_path).resume(str(tmp_path / "weights.pt"))


# ------------------------------------------------------------------ checkpoints move between GPUs and CPUs

GPU1 = DistEnv(rank=0, local_rank=1, world_size=1, device=torch.device("cuda", 1))


def gpu_written_checkpoint(tmp_path, monkeypatch) -> tuple:
    """A checkpoint as a run on a machine's second GPU writes it: every tensor tagged for cuda:1, with that
    GPU's random stream. (Written on the CPU: torch.save is told that each tensor lives on cuda:1.)"""
    saver = build_checkpointer(tmp_path)
    take_steps(saver)
    save_epoch(saver, 2, 0.75, True)
    state = load(tmp_path / "last.pt")
    gpu_stream = torch.arange(16, dtype=torch.uint8)
    state["rng"][0]["cuda"] = gpu_stream
    with monkeypatch.context() as patched:
        patched.setattr(torch.serialization, "location_tag", lambda storage: "cuda:1")
        torch.save(state, tmp_path / "last.pt")
    return saver, gpu_stream


def test_a_checkpoint_written_on_a_gpu_resumes_on_a_machine_without_one(tmp_path, monkeypatch):
    saver, _ = gpu_written_checkpoint(tmp_path, monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no GPU here, and no CUDA driver started
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(tmp_path / "last.pt", weights_only=True)  # it really asks for a GPU where it is not mapped

    resumer = build_checkpointer(tmp_path)

    assert resumer.resume("auto") == acc_state(2, 0.75, EpochProgress())
    assert_same_weights(resumer.model.state_dict(), saver.model.state_dict())
    assert resumer.optimizer.state_dict()["state"], "momentum buffers are missing"


def test_a_resume_on_a_gpu_reads_the_checkpoint_onto_the_cpu_and_gives_the_gpu_its_own_stream(tmp_path, monkeypatch):
    _, gpu_stream = gpu_written_checkpoint(tmp_path, monkeypatch)
    given = {}
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: given.update(state=state, device=device))
    # The model stays on the CPU: what is tested is where the checkpoint's pieces go.
    resumer = build_checkpointer(tmp_path, env=GPU1)

    assert resumer.resume("auto").epochs_done == 2

    assert given["device"] == torch.device("cuda", 1)
    assert given["state"].device.type == "cpu"  # the CUDA RNG API takes a CPU tensor
    assert torch.equal(given["state"], gpu_stream)


def test_a_gpu_run_saves_its_own_gpus_random_stream_only(tmp_path, monkeypatch):
    own_stream = torch.arange(8, dtype=torch.uint8)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: own_stream if device == GPU1.device else None)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("every GPU's stream was saved"))
    saver = build_checkpointer(tmp_path, env=GPU1)

    save_epoch(saver, 1, 0.5, True)

    assert torch.equal(load(tmp_path / "last.pt")["rng"][0]["cuda"], own_stream)


def test_a_cpu_run_never_touches_cuda_when_it_saves_and_resumes(tmp_path, monkeypatch):
    for name in ("is_available", "get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all", "init"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, _name=name, **kwargs: pytest.fail(f"torch.cuda.{_name}()"))
    saver = build_checkpointer(tmp_path)
    take_steps(saver)

    save_epoch(saver, 1, 0.5, True)

    assert build_checkpointer(tmp_path).resume("auto").epochs_done == 1
    assert load(tmp_path / "last.pt")["rng"][0]["cuda"] is None


def test_a_checkpoint_without_loss_scaling_resumes_a_run_with_it_on_a_fresh_scaler(tmp_path):
    saver = build_checkpointer(tmp_path)  # its scaler is off, as on a CPU, with --no-amp or with bfloat16
    save_epoch(saver, 1, 0.5, True)
    assert load(tmp_path / "last.pt")["scaler"] == {}
    resumer = build_checkpointer(tmp_path)
    resumer.scaler = torch.amp.GradScaler("cpu", enabled=True)

    assert resumer.resume("auto").epochs_done == 1

    assert resumer.scaler.get_scale() == torch.amp.GradScaler("cpu", enabled=True).get_scale()


def test_a_gpu_checkpoint_predicts_on_the_cpu(tmp_path, monkeypatch):
    from {{ cookiecutter.project_slug }} import inference, seam

    saver, _ = gpu_written_checkpoint(tmp_path, monkeypatch)
    linear = seam.Task(model=SimpleNamespace(build_model=lambda num_classes, **options: nn.Linear(4, num_classes)))
    inputs = torch.randn(5, 4)

    model = inference.load_for_inference(tmp_path / "last.pt", device="cpu", task=linear)

    assert next(model.parameters()).device == torch.device("cpu")
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), saver.model(inputs), rtol=0, atol=0)


def fsdp_checkpointer(directory) -> Checkpointer:
    """A Checkpointer of a model sharded by FSDP2 over this process's group of one: it saves folders of shards."""
    model = nn.Linear(4, 3)
    fsdp.shard(model, "cpu", world_size=1, machines=1, amp_dtype=None)
    return build_checkpointer(directory, model=model)


def test_a_sharded_save_is_a_folder_the_last_and_best_links_point_at_and_older_saves_go(tmp_path, process_group_of_one):
    saver = fsdp_checkpointer(tmp_path)
    save_epoch(saver, 1, 0.5, True)
    first = (tmp_path / "last").resolve()
    save_epoch(saver, 2, 0.5, False)

    second = (tmp_path / "last").resolve()
    assert (tmp_path / "best").resolve() == first and second != first
    assert sorted(path.name for path in tmp_path.glob("save-*")) == sorted([first.name, second.name])
    assert build_checkpointer(tmp_path).resume("auto").epochs_done == 2  # read whole by an unsharded model


def test_the_two_best_sharded_saves_are_kept_beside_the_last_and_listed_best_first(tmp_path, process_group_of_one):
    saver = fsdp_checkpointer(tmp_path)
    save_epochs_keeping_the_best_two(saver, [0.5, 0.7, 0.6, 0.4])

    top = json.loads((tmp_path / "top.json").read_text())
    assert [(entry["epoch"], entry["value"]) for entry in top] == [(2, 0.7), (3, 0.6)]
    kept = {(tmp_path / entry["path"]).resolve() for entry in top}
    assert (tmp_path / "best").resolve() == (tmp_path / top[0]["path"]).resolve()
    assert set(tmp_path.glob("save-*")) == kept | {(tmp_path / "last").resolve()}  # epoch 1's save is gone
    assert build_checkpointer(tmp_path).resume("auto").epochs_done == 4


def test_a_sharded_save_that_fails_midway_leaves_the_last_one_complete(tmp_path, process_group_of_one, monkeypatch):
    saver = fsdp_checkpointer(tmp_path)
    save_epoch(saver, 1, 0.5, True)
    before = (tmp_path / "last").resolve()

    def crash(*args, **kwargs):
        raise OSError("the machine went away")

    monkeypatch.setattr(checkpoint.dcp, "save", crash)
    with pytest.raises(OSError):
        save_epoch(saver, 2, 0.5, False)

    assert (tmp_path / "last").resolve() == before
    assert [path.name for path in tmp_path.glob("save-*")] == [before.name]  # the failed save's folder is gone
    assert build_checkpointer(tmp_path).resume("auto").epochs_done == 1


def test_a_copy_that_followed_the_links_saves_on_as_a_sharded_checkpoint(tmp_path, process_group_of_one):
    saver = fsdp_checkpointer(tmp_path / "run")
    save_epoch(saver, 1, 0.5, True)
    shutil.copytree(tmp_path / "run", tmp_path / "copy", symlinks=False)  # as cp -rL does: links become folders
    assert not (tmp_path / "copy" / "last").is_symlink()

    copied = fsdp_checkpointer(tmp_path / "copy")
    assert copied.resume("auto").epochs_done == 1
    save_epoch(copied, 2, 0.5, False)

    assert (tmp_path / "copy" / "last").is_symlink()
    assert build_checkpointer(tmp_path / "copy").resume("auto").epochs_done == 2


def test_resume_auto_takes_the_newer_of_the_file_and_the_sharded_folder(tmp_path, process_group_of_one):
    save_epoch(build_checkpointer(tmp_path), 1, 0.5, True)  # last.pt
    save_epoch(fsdp_checkpointer(tmp_path), 2, 0.5, False)  # then last/
    assert build_checkpointer(tmp_path).resume("auto").epochs_done == 2

    save_epoch(build_checkpointer(tmp_path), 3, 0.5, False)  # then last.pt again
    assert build_checkpointer(tmp_path).resume("auto").epochs_done == 3


def test_ranks_that_find_different_sharded_saves_stop_before_loading_instead_of_waiting_for_each_other(
    tmp_path, process_group_of_one, monkeypatch
):
    save_epoch(fsdp_checkpointer(tmp_path), 1, 0.5, True)
    # What rank 0 sees beside a machine whose --output-dir holds no checkpoint: a sharded load would hang.
    monkeypatch.setattr(checkpoint.distributed, "all_gather_object", lambda found: [found, None])

    with pytest.raises(UserError, match="ranks found different checkpoints") as error:
        fsdp_checkpointer(tmp_path).resume("auto")

    assert "shared filesystem" in str(error.value)


def test_a_sharded_save_of_another_model_is_refused_naming_the_mismatch(tmp_path, process_group_of_one):
    save_epoch(fsdp_checkpointer(tmp_path), 1, 0.5, True)

    with pytest.raises(UserError, match=r"does not match the model \(Size mismatch .*\[3, 4\].*\[5, 4\]"):
        build_checkpointer(tmp_path, out_features=5).resume("auto")


def whole(tensors: dict) -> dict:
    return {name: tensor.full_tensor() if isinstance(tensor, DTensor) else tensor for name, tensor in tensors.items()}


def test_the_average_moves_one_minus_decay_towards_the_weights_and_buffers_at_each_step_in_float32(tmp_path):
    saver = averaging(build_checkpointer(tmp_path, model=nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))))
    saver.resume("none")  # the average starts at the weights
    before = {name: average.clone() for name, average in saver.ema.averages.items()}

    take_averaged_steps(saver, 1)

    weights = saver.model.state_dict()
    assert sorted(saver.ema.averages) == sorted(set(weights) - {"1.num_batches_tracked"})  # floating-point ones
    for name, average in saver.ema.averages.items():
        assert average.dtype == torch.float32
        torch.testing.assert_close(average, 0.9 * before[name] + 0.1 * weights[name])


def test_a_stop_saves_both_weights_and_its_resume_goes_on_averaging_as_if_never_stopped(tmp_path, caplog):
    torch.manual_seed(0)
    saver = averaging(build_checkpointer(tmp_path))
    saver.resume("none")
    take_averaged_steps(saver, 2)
    saver.save_progress(EpochProgress(step=2, consumed=16))  # as a SIGTERM stop saves
    saved = load(tmp_path / "last.pt")
    assert_same_weights(saved["model"], saver.model.state_dict())
    assert_same_weights(saved["ema"], saver.ema.averages) and saved["ema_decay"] == 0.9
    # predict.py and export.py: the averages, or with --weights raw the trained weights.
    assert_same_weights(checkpoint.read_weights(tmp_path / "last.pt")[0], saved["ema"])
    assert_same_weights(checkpoint.read_weights(tmp_path / "last.pt", averaged=False)[0], saved["model"])
    take_averaged_steps(saver, 2)  # the uninterrupted run

    resumed = averaging(build_checkpointer(tmp_path), decay=None)  # resumed without --ema
    with caplog.at_level(logging.INFO):
        assert resumed.resume("auto").ema_decay == 0.9
    take_averaged_steps(resumed, 2)

    assert "this run goes on with the resumed run's --ema 0.9" in caplog.text
    assert_same_weights(resumed.ema.averages, saver.ema.averages)


def test_ema_on_a_resume_of_a_checkpoint_without_averages_starts_them_at_its_weights_and_says_so(tmp_path, caplog):
    saver = build_checkpointer(tmp_path)  # a run without --ema, or of a version before it
    take_steps(saver)
    save_epoch(saver, 1, 0.5, True)

    resumed = averaging(build_checkpointer(tmp_path), 0.99)
    with caplog.at_level(logging.INFO):
        resumed.resume("auto")

    assert "the checkpoint holds no averaged weights; the average starts at its weights" in caplog.text
    assert_same_weights(resumed.ema.averages, saver.model.state_dict())
    plain = averaging(build_checkpointer(tmp_path), None)  # nor does a resume without --ema
    plain.resume("auto")
    assert not plain.ema.active and load(tmp_path / "last.pt")["ema"] == {}


def test_sharded_averages_are_saved_under_their_own_key_and_resume_whole_or_sharded(tmp_path, process_group_of_one):
    saver = averaging(fsdp_checkpointer(tmp_path))
    saver.resume("none")
    take_averaged_steps(saver)
    assert isinstance(saver.ema.averages["weight"], DTensor)  # each rank averages its shard
    save_epoch(saver, 1, 0.5, True)
    averages = whole(saver.ema.averages)

    unsharded = averaging(build_checkpointer(tmp_path), None)
    unsharded.resume("auto")
    assert_same_weights(unsharded.ema.averages, averages)
    sharded = averaging(fsdp_checkpointer(tmp_path), None)
    sharded.resume("auto")
    assert_same_weights(whole(sharded.ema.averages), averages)
    assert_same_weights(checkpoint.read_weights(tmp_path / "best")[0], averages)
    assert not torch.equal(checkpoint.read_weights(tmp_path / "best", averaged=False)[0]["weight"], averages["weight"])

    unsharded.end_epoch(2, {"loss": 1.0, "acc": 0.4})  # a file now, read into the shards of a sharded model
    from_file = averaging(fsdp_checkpointer(tmp_path), None)
    from_file.resume(str(tmp_path / "last.pt"))
    assert_same_weights(whole(from_file.ema.averages), averages)


class PretrainedBody(nn.Module):
    """A network whose body a pretrained file fits and whose head (another number of classes) it does not; its
    table is a buffer no state dict holds (persistent=False), as the regression sample's target statistics are."""

    def __init__(self, classes: int = 3):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, classes)
        self.register_buffer("table", torch.rand(5), persistent=False)


def built_as_run_py_builds(env: DistEnv, strategy: str, init_from: str) -> nn.Module:
    torch.manual_seed(0)  # engine.seed_everything(): the same initial weights on every rank
    with engine.whole_on_rank0_only(env, strategy, init_from):
        return PretrainedBody()


def init_from_worker(rank: int, port: int, init_from: str, out_dir: str) -> None:
    """Rank `rank` of 2 starting from `init_from` under --strategy fsdp, as training.py does: what it built, how
    many files it read, the whole weights it trains from, and the error that stopped it, if one did."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")  # fmt: skip
    env = distributed.setup("cpu", timeout_s=60)
    reads = []
    loading = torch.load

    def reading(path, *args, **kwargs):
        reads.append(path)
        return loading(path, *args, **kwargs)

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch, "load", reading)
            network = built_as_run_py_builds(env, "fsdp", init_from)
            built_on_meta = next(network.parameters()).is_meta
            model = distributed.wrap_model(network, env, strategy="fsdp")
            error = ""
            try:
                build_checkpointer(os.path.join(out_dir, "checkpoints"), model=model, env=env).resume("none", init_from)
            except UserError as raised:
                error = f"{raised} (shown: {raised.shown})"
        weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))  # whole, gathered
        save_rank_result(out_dir, rank, {
            "parameters": [value.detach().numpy() for value in weights.values()], "table": model.table.numpy(),
            "reads": len(reads), "on_meta": built_on_meta, "error": error,
        })  # fmt: skip
    finally:
        distributed.cleanup()


def init_from_on_two_fsdp_ranks(tmp_path, init_from) -> list[dict]:
    out_dir = tmp_path / "ranks"
    out_dir.mkdir()
    mp.spawn(init_from_worker, args=(free_port(), str(init_from), str(out_dir)), nprocs=2)
    return rank_results(out_dir, world_size=2)


def pretrained_file(tmp_path, classes: int) -> str:
    torch.manual_seed(1)
    path = tmp_path / "pretrained.pt"
    torch.save(PretrainedBody(classes).state_dict(), path)
    return str(path)


@pytest.mark.slow
def test_init_from_under_fsdp_starts_from_the_weights_ddp_starts_from_and_only_rank_0_reads_the_file(tmp_path):
    pretrained = pretrained_file(tmp_path, classes=10)  # the body fits, the head is new
    # What DDP trains from: on every rank, the network built whole and the fitting tensors read from the file.
    expected = built_as_run_py_builds(CPU, "ddp", pretrained)
    build_checkpointer(tmp_path / "ddp", model=expected).resume("none", pretrained)

    ranks = init_from_on_two_fsdp_ranks(tmp_path, pretrained)

    for rank in ranks:
        assert str(rank["error"]) == ""
        for got, wanted in zip(rank["parameters"], expected.state_dict().values(), strict=True):
            np.testing.assert_array_equal(got, wanted.numpy())
        np.testing.assert_array_equal(rank["table"], expected.table.numpy())  # sent, though no state dict holds it
    assert [int(rank["reads"]) for rank in ranks] == [1, 0]
    assert [bool(rank["on_meta"]) for rank in ranks] == [False, True]  # rank 1 never held the whole network


@pytest.mark.slow
def test_init_from_weights_of_another_network_under_fsdp_stops_every_rank_said_once_instead_of_hanging(tmp_path):
    unrelated = tmp_path / "unrelated.pt"
    torch.save({"encoder.weight": torch.ones(2, 2)}, unrelated)

    ranks = init_from_on_two_fsdp_ranks(tmp_path, unrelated)

    said = "none of its 1 tensors fits build_model()'s names and shapes"
    assert said in str(ranks[0]["error"]) and str(ranks[0]["error"]).endswith("(shown: True)")
    assert said in str(ranks[1]["error"]) and str(ranks[1]["error"]).endswith("(shown: False)")
    assert [int(rank["reads"]) for rank in ranks] == [1, 0]


@pytest.mark.slow
def test_under_fsdp_each_rank_averages_its_shard_as_ddp_averages_the_whole(project_root, tmp_path, averaged_run):
    run_sh(project_root, tmp_path / "fsdp", "--epochs", "2", "--ema", "0.9", "--strategy", "fsdp")

    def results(output) -> list[dict]:  # the task's metrics and the training loss, epoch by epoch
        records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k == "train_loss" or k.startswith("val_")} for r in records]

    for by_ddp, by_fsdp in zip(results(averaged_run), results(tmp_path / "fsdp"), strict=True):
        assert by_fsdp == pytest.approx(by_ddp, rel=1e-5)
