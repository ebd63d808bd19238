"""Reading what the trackers received: a TensorBoard event file's scalars, an offline wandb run's records."""

from __future__ import annotations

import glob
import json
import time
from pathlib import Path


def read_wandb_records(path):
    """The protobuf records of a wandb run file (a leveldb-style log of 32 KiB blocks)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B"
    block, pos, buf = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk  # FULL/FIRST start a record, MIDDLE/LAST extend it
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            yield rec


def trainer_events(out_dir):
    """The Trainer's single TensorBoard event file under ``out_dir``, read by TensorBoard's reader; the probe's own
    folder (``moral_probe_<name>/``) is not the Trainer's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = [e for e in glob.glob(str(out_dir / "**" / "events.out.tfevents*"), recursive=True)
              if not Path(e).parent.name.startswith("moral_probe_")]
    assert len(events) == 1, events
    acc = EventAccumulator(events[0])
    acc.Reload()
    return acc


def tensorboard_scalars(out_dir, tag="eval/moral_scifi/score"):
    """{step: value} of one scalar tag in the Trainer's own event file ({} when absent)."""
    acc = trainer_events(out_dir)
    return {s.step: s.value for s in acc.Scalars(tag)} if tag in acc.Tags()["scalars"] else {}


def tensorboard_tags(out_dir) -> list[str]:
    """The scalar tags of the Trainer's own event file."""
    return trainer_events(out_dir).Tags()["scalars"]


def probe_tensorboard(out_dir, key="scifi"):
    """The probe's own TensorBoard folder under ``out_dir`` (one), read by TensorBoard's reader, images included."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folders = {Path(e).parent for e in glob.glob(str(out_dir / "**" / f"moral_probe_{key}" / "events.out.tfevents*"),
                                                 recursive=True)}
    assert len(folders) == 1, folders
    acc = EventAccumulator(str(folders.pop()), size_guidance={"images": 0, "tensors": 0, "scalars": 0})
    acc.Reload()
    return acc


def probe_scalars(out_dir, tag="eval/moral_scifi/score", key="scifi"):
    """{step: value} of one scalar tag in the probe's own folder ({} when absent): a callback given no trainer=."""
    acc = probe_tensorboard(out_dir, key)
    return {s.step: s.value for s in acc.Scalars(tag)} if tag in acc.Tags()["scalars"] else {}


def wandb_run_records(wandb_dir, wait_s=60):
    """(history items per logged row, metric definitions, config) of the single offline wandb run under ``wandb_dir``.

    Waits for the run's closing ``exit`` record (wandb's service may still be writing after ``finish``),
    so that an absent key means it was never logged, not that the file is incomplete.
    """
    deadline = time.monotonic() + wait_s
    while True:
        run_files = glob.glob(str(wandb_dir / "wandb" / "offline-run-*" / "*.wandb"))
        try:
            records = list(read_wandb_records(run_files[0])) if len(run_files) == 1 else []
        except Exception:  # noqa: BLE001 - a record still being written
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(run_files) == 1 and any(r.WhichOneof("record_type") == "exit" for r in records), run_files
    rows, metrics, config = [], [], {}
    for rec in records:
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            rows.append({i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item})
        elif kind == "metric":
            metrics.append(rec.metric)
        elif kind == "config":
            config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.config.update})
    return rows, metrics, config
