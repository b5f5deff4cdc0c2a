"""W&B logging (``train.loggers: [.., wandb]``): a real offline wandb run written through the MetricsSink and read
back from its ``.wandb`` transaction log (wandb's own protobuf records), with drmas's keys and the reference
code's ``actor/{m}/...`` names."""
from __future__ import annotations

import json
import re
import struct
import time
from pathlib import Path

import pytest

wandb = pytest.importorskip("wandb", reason="the wandb extra (pip install 'drmas[wandb]')")

from drmas.config import ConfigError, load_config  # noqa: E402
from drmas.loggers import MetricsSink, reference_names  # noqa: E402

BLOCK, HEADER = 32768, 7  # the .wandb file: a 7-byte ':W&B' header, then LevelDB-log blocks of records


def wandb_records(path: Path) -> list[bytes]:
    """The records of a .wandb transaction log (LevelDB log format: per chunk crc32 u32, length u16, type u8;
    type 1 = a whole record, 2/3/4 = its first/middle/last part; a block tail under 7 bytes is padding)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    records, part, pos = [], b"", HEADER
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        if pos + 7 + length > len(data):  # a chunk still being written
            break
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            records.append(part)
            part = b""
    return records


def history(run_dir: Path, wait_s: float = 60.0) -> list[dict]:
    """The history rows of the run's offline transaction log, read once it holds the run's exit record (the
    wandb-core service may still be writing the file when ``finish()`` returns)."""
    from wandb.proto import wandb_internal_pb2 as pb

    deadline = time.monotonic() + wait_s
    while True:
        logs = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
        records = []
        for raw in wandb_records(logs[0]) if len(logs) == 1 and logs[0].stat().st_size else []:
            rec = pb.Record()
            rec.ParseFromString(raw)
            records.append(rec)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(logs) == 1, logs
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def test_an_offline_wandb_run_holds_the_metrics_under_both_names(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is the default
    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = MetricsSink(tmp_path, ["jsonl", "wandb"], name="wb_test", config={"train": {"steps": 3}})
    sink.write_eval({"step": 0, "benchmark": "d1-word", "avg": 0.25, "pass": 0.5, "k": 4, "n_tasks": 8, "successes": []})
    for step in range(3):
        sink.write_step(step, {"reward/mean": 0.1 * step, "wg/solver_model/grad_norm": 1.0 + step,
                               "wg/solver_model/loss": -0.5, "agent/solver/grad_norm": 0.5 + step,
                               "agent/solver/lemma_factor": float("nan"), "steps": 12})
    sink.close()
    rows = [r for r in history(tmp_path) if "_step" in r]
    by_step = {}
    for r in rows:
        by_step.setdefault(r["_step"], {}).update(r)
    assert sorted(by_step) == [0, 1, 2]
    assert by_step[0]["eval/d1-word/avg@4"] == 0.25 and by_step[0]["eval/d1-word/pass@4"] == 0.5
    for step in range(3):
        got = by_step[step]
        assert got["actor/solver_model/grad_norm"] == got["wg/solver_model/grad_norm"] == 1.0 + step
        assert got["actor/solver_model/pg_loss"] == -0.5 and got["agent/solver/grad_norm"] == 0.5 + step
        assert got["reward/mean"] == pytest.approx(0.1 * step) and "agent/solver/lemma_factor" not in got  # NaN left out
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3  # JSONL is written as always
    assert not (tmp_path / "tb").exists()  # only the loggers asked for


def test_reference_names_map_the_worker_group_keys():
    m = {"wg/a/grad_norm": 1.0, "wg/a/clip_frac": 0.1, "wg/a/approx_kl_old": 0.01, "wg/a/skipped": 0,
         "agent/x/grad_norm": 2.0}
    assert reference_names(m) == {"actor/a/grad_norm": 1.0, "actor/a/pg_clipfrac": 0.1, "actor/a/ppo_kl": 0.01}


def test_loggers_config_names_registered_loggers():
    assert load_config(None, ["train.loggers=[jsonl, tensorboard, wandb]"]).train.loggers[-1] == "wandb"
    with pytest.raises(ConfigError, match="unknown logger 'mlflow'"):
        load_config(None, ["train.loggers=[mlflow]"])


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, monkeypatch):
    """Two sinks on one run folder (a run, then its resume) log to one W&B run id, kept in <run>/wandb/run_id."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    for step in (0, 1):
        sink = MetricsSink(tmp_path, ["wandb"], name="wb_resume")
        sink.write_step(step, {"reward/mean": 0.5})
        sink.close()
    run_id = (tmp_path / "wandb" / "run_id").read_text().strip()
    dirs = sorted(tmp_path.glob("wandb/offline-run-*"))
    # offline-run-<date>_<time>-<id>, and "-1" after it when both started in the same second
    assert len(dirs) == 2 and all(re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{run_id}(-\d+)?", d.name) for d in dirs), dirs


def test_a_wandb_logger_that_cannot_start_stops_the_run_in_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    """A file in the way of <run>/wandb, and online mode with no API key (no network here): one `drmas:` line
    that says why and what to do (WANDB_MODE=offline), exit 1, and nothing of the run written."""
    from drmas.cli import main
    from drmas.loggers import LoggerUnavailable

    run = tmp_path / "runs" / "wb_blocked"
    run.mkdir(parents=True)
    (run / "wandb").write_text("not a folder")
    args = ["train", "experiments/configs/cpu/math_base.yaml", f"out_dir={tmp_path}/runs", "name=wb_blocked",
            "train.loggers=[wandb]", "train.steps=1", "--no-progress"]
    assert main(args) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("drmas:")]
    assert err == [f"drmas: {run / 'wandb'} is a file, in the way of the W&B run folder; move it away, or drop "
                   "wandb from train.loggers"]
    assert not (run / "metrics.jsonl").exists() and not (run / "manifest.json").exists()

    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))  # no login kept from elsewhere
    with pytest.raises(LoggerUnavailable, match=r"the wandb logger could not start \(WANDB_MODE=online\): .*set "
                                                r"WANDB_MODE=offline to write the run into .*wandb_online/wandb"):
        MetricsSink(tmp_path / "wandb_online", ["wandb"]).open()
