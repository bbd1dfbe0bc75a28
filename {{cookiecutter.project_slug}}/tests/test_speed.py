"""Speed switches and mixed precision, decided without a GPU: the compute capability is an argument."""

import json
import logging
import os
import subprocess
import sys

import pytest

from {{ cookiecutter.project_slug }} import checkpoint, distributed, hardware, inference, seam, settings, task, workspace
from {{ cookiecutter.project_slug }}.errors import UserError
from {{ cookiecutter.project_slug }}.state import TrainingState


@pytest.mark.parametrize(
    "capability, asked, dtype",
    [
        ((7, 0), "auto", "fp16"),  # V100: bfloat16 only emulated
        ((7, 5), "fp16", "fp16"),  # T4
        ((8, 0), "auto", "bf16"),  # A100
        ((9, 0), "auto", "bf16"),  # H100
        ((9, 0), "fp16", "fp16"),  # forced: the float16 path with its scaler, on a GPU that has both
        (None, "auto", None),  # no GPU: full precision
    ],
)
def test_mixed_precision_is_bfloat16_from_compute_capability_8_and_float16_before(capability, asked, dtype):
    assert hardware.amp_dtype(True, asked, capability) == dtype


def test_no_amp_is_full_precision_on_any_gpu():
    assert hardware.amp_dtype(False, "bf16", (9, 0)) is None


def test_bfloat16_forced_on_a_gpu_without_it_is_one_line():
    with pytest.raises(UserError, match=r"--amp-dtype bf16: this GPU \(compute capability 7.5\) has no native"):
        hardware.amp_dtype(True, "bf16", (7, 5))


def test_a_resume_in_another_precision_says_so(caplog):
    saved = TrainingState(epochs_done=3, amp_dtype="bf16")  # trained on an A100, resumed on a V100

    with caplog.at_level(logging.INFO):
        saved.switch_precision("fp16")

    assert "the checkpoint trained in bf16; this run trains in fp16" in caplog.text
    assert saved.amp_dtype == "fp16"


def test_channels_last_puts_convolution_weights_in_channels_last_or_says_paddle_has_no_switch(caplog):
    # A convolution network of the test's own: the switch is about convolutions, whatever network model.py builds.
    if settings.FRAMEWORK == "pytorch":
        import torch

        network = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3))
        env = distributed.DistEnv(0, 0, 1, torch.device("cpu"))
    else:
        import paddle

        network = paddle.nn.Sequential(paddle.nn.Conv2D(3, 8, 3), paddle.nn.ReLU(), paddle.nn.Conv2D(8, 4, 3))
        env = distributed.DistEnv(0, 0, 1, "cpu")

    with caplog.at_level(logging.INFO):
        model = distributed.wrap_model(network, env, channels_last=True)

    if settings.FRAMEWORK == "pytorch":
        conv = next(layer for layer in model.modules() if isinstance(layer, torch.nn.Conv2d))
        assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    else:
        assert "--channels-last is PyTorch's" in caplog.text


def run_sh(project_root, output, *args: str, nproc: int = 2) -> str:
    command = ["bash", "run.sh", "--device", "cpu", "--output-dir", str(output), "--batch-size", "64", *args]
    if settings.DATASET == "zip":
        command += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output.parent / "data")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NNODES")}
    env.update(NPROC_PER_NODE=str(nproc), PATH=os.path.dirname(sys.executable) + os.pathsep + env["PATH"])
    result = subprocess.run(command, cwd=project_root, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return (output / "train.log").read_text()


def losses(output) -> list[tuple]:
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return [(row["epoch"], row["train_loss"], row["val_loss"], row[f"val_{task.BEST_METRIC}"]) for row in rows]


@pytest.mark.slow
def test_two_deterministic_runs_train_the_same_losses(project_root, tmp_path):
    for name in ("first", "second"):
        log = run_sh(project_root, tmp_path / name / "output", "--epochs", "2", "--deterministic", nproc=1)
        assert "1 process(es) on cpu, full precision;" in log

    assert losses(tmp_path / "first" / "output") == losses(tmp_path / "second" / "output")


@pytest.mark.slow
def test_a_compiled_run_compiles_each_batch_size_once_saves_the_plain_model_and_resumes_with_or_without_compile(
    project_root, tmp_path, monkeypatch
):
    output, torch_log = tmp_path / "output", tmp_path / "torch.log"
    monkeypatch.setenv("TORCH_LOGS", "recompiles,dynamic")  # PyTorch's account of what it compiled, and why
    monkeypatch.setenv("TORCH_LOGS_OUT", str(torch_log))  # (both processes append to it, each line with its pid)

    log = run_sh(project_root, output, "--epochs", "3", "--compile")
    monkeypatch.delenv("TORCH_LOGS")
    weights, data = checkpoint.read_weights(inference.checkpoint_path(output, "last"))
    run_sh(project_root, output, "--epochs", "4")  # resumed without --compile
    run_sh(project_root, output, "--epochs", "5", "--compile")  # and with it again

    model = seam.Task().network(data)
    assert sorted(weights) == sorted(model.state_dict())  # no _orig_mod., no module.
    assert [epoch for epoch, *_ in losses(output)] == [1, 2, 3, 4, 5]
    if settings.FRAMEWORK == "paddle":
        assert "--compile is PyTorch's" in log
        return
    assert "--compile: the first step took" in log
    lines = torch_log.read_text(encoding="utf-8").splitlines()
    # The batch dimension is never symbolic: an epoch's last, smaller batch compiled for its own size.
    assert not [line for line in lines if "create_symbol" in line and ".size()[0]" in line]
    # No process compiles for the same cause twice (3 epochs: a recompilation each epoch would), nor often enough
    # to reach dynamo's limit of 8 and fall back to eager.
    causes = recompile_causes(lines)
    assert any("create_env" in line for line in lines)  # (dynamo compiled, and its log was written)
    assert all(len(set(found)) == len(found) < 8 for found in causes.values()), causes


def recompile_causes(lines: list[str]) -> dict[str, list[str]]:
    """Each process's recompilations in TORCH_LOGS=recompiles lines (processes by pid): "frame: the first guard
    that failed", e.g. "0: - 0/0: tensor 'args[0]' size mismatch at index 0. expected 32, actual 15"."""
    said: dict[str, list[tuple[str, str]]] = {}
    for line in lines:
        if "[__recompiles]" in line:
            where, text = line.split("[__recompiles]", 1)
            said.setdefault(line.split()[2], []).append((where.rsplit("[", 1)[1].strip("] "), text.strip()))
    return {
        process: [
            frame.split("/")[0] + ": " + next(later for _, later in found[index + 1 :] if later.startswith("- "))
            for index, (frame, text) in enumerate(found)
            if text.startswith("Recompiling")
        ]
        for process, found in said.items()
    }
