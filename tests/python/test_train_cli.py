"""zero-train as a program: the effective config, rejected configs, the device
check, and a loss that falls (1 rank, and 2 ranks at ZeRO stage 3)."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from train_helpers import TINY, corpus, metrics, run_train  # noqa: E402


def test_print_config_is_complete_and_reloadable(tmp_path):
    p = run_train(["--print-config"])
    cfg = json.loads(p.stdout)
    # defaults filled in, DeepSpeed's names
    assert cfg["model"] == {"n_layer": 4, "n_head": 4, "d_model": 128, "seq_len": 64, "vocab": 256, "tp": 1, "pp": 1,
                            "pp_schedule": "1f1b", "pp_virtual": 1,
                            "moe": {"experts": 0, "top_k": 1, "capacity_factor": 1.0, "aux_loss_coef": 0.01, "ep": 1},
                            "cp": 1, "sequence_parallel": False}
    assert cfg["train_micro_batch_size_per_gpu"] == 8 and cfg["gradient_accumulation_steps"] == 1
    assert cfg["train_batch_size"] == 8
    assert cfg["zero_optimization"]["stage"] == 3
    assert cfg["scheduler"]["type"] == "WarmupCosineLR"
    assert cfg["optimizer"]["type"] == "AdamW" and cfg["optimizer"]["params"]["lr"] == 0.003
    # what it prints is a valid config that prints the same again
    f = tmp_path / "eff.json"
    f.write_text(p.stdout)
    assert json.loads(run_train(["--config", str(f), "--print-config"]).stdout) == cfg
    # overrides land in the effective config
    over = json.loads(run_train(["--print-config", "--steps", "7", "--stage", "1",
                                 "--set", "model.n_layer=2"]).stdout)
    assert over["train"]["steps"] == 7 and over["zero_optimization"]["stage"] == 1
    assert over["model"]["n_layer"] == 2


def test_prefetch_window_auto_is_two_blocks(tmp_path):
    """zero_optimization.stage3_prefetch_bucket_size "auto" (the built-in config's):
    zero-train fills in two dense blocks' parameters, 2 x (12 d^2 + 13 d), at every
    d_model; an explicit value is kept; "auto" in a config file works the same."""
    def window(*args):
        return json.loads(run_train(["--print-config", *args]).stdout)["zero_optimization"][
            "stage3_prefetch_bucket_size"]
    for d in (128, 512):
        assert window("--set", f"model.d_model={d}") == 2 * (12 * d * d + 13 * d)
    assert window("--set", "zero_optimization.stage3_prefetch_bucket_size=123456") == 123456
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto"},
                             "model": {"d_model": 256, "n_head": 4}}))
    assert window("--config", str(f)) == 2 * (12 * 256 * 256 + 13 * 256)
    f.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    assert window("--config", str(f)) == 50000000  # DeepSpeed's default when the key is absent


# issue 10 B6/B7: --print-config prints every key the config holds, and what it
# prints loads back and prints the same text again, whatever the sections
ROUND_TRIP = {
    "builtin": {},
    "no_scheduler": {"scheduler": None},
    "warmup_lr": {"scheduler": {"type": "WarmupLR"}},
    "warmup_decay": {"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5}}},
    "offload_fp16_sgd": {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                               "sub_group_size": 12345},
                         "fp16": {"enabled": True, "loss_scale": 128},
                         "optimizer": {"type": "SGD", "params": {"lr": 0.30000000000000004, "momentum": 0.9}},
                         "aio": {"block_size": 8192}, "train_batch_size": 8888888810,
                         "gradient_accumulation_steps": 888888881},
    "param_offload": {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nv",
                                                                          "buffer_count": 3, "buffer_size": 4096,
                                                                          "max_in_cpu": 7}}},
    "activation_checkpointing": {"activation_checkpointing": {"number_checkpoints": 2, "profile": True}},
    "activation_checkpointing_all": {"activation_checkpointing": {}},
}


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_print_config_round_trips_exactly(tmp_path, name):
    src = tmp_path / "src.json"
    src.write_text(json.dumps(ROUND_TRIP[name]))
    first = run_train(["--config", str(src), "--print-config"]).stdout
    printed = tmp_path / "printed.json"
    printed.write_text(first)
    assert run_train(["--config", str(printed), "--print-config"]).stdout == first
    cfg = json.loads(first)
    zo = cfg["zero_optimization"]
    assert set(zo["offload_optimizer"]) == {"device", "nvme_path", "pin_memory", "buffer_count"}
    assert set(zo["offload_param"]) == {"device", "nvme_path", "pin_memory", "buffer_count", "buffer_size",
                                        "max_in_cpu"}
    assert "sub_group_size" in zo and set(cfg["aio"]) == {"block_size", "queue_depth"}
    assert "scheduler" in cfg and cfg["train"]["comm_timeout_s"] == 120.0
    if name == "offload_fp16_sgd":
        assert zo["offload_optimizer"]["device"] == "cpu" and zo["sub_group_size"] == 12345
        assert cfg["optimizer"]["params"]["lr"] == 0.30000000000000004  # 17 digits where 15 do not load back
        assert cfg["train_batch_size"] == 8888888810  # 64-bit, not wrapped
    if name == "param_offload":
        assert zo["offload_param"] == {"device": "nvme", "nvme_path": "/nv", "pin_memory": False,
                                       "buffer_count": 3, "buffer_size": 4096, "max_in_cpu": 7}


def test_builtin_config_is_configs_default_json():
    """docs/zero-train.md: configs/default.json is the built-in config as --print-config writes it."""
    from train_helpers import SRC
    text = open(os.path.join(SRC, "configs", "default.json")).read()
    assert run_train(["--print-config"]).stdout == text
    assert run_train(["--config", os.path.join(SRC, "configs", "default.json"), "--print-config"]).stdout == text


def test_checkpoint_stores_the_whole_config(tmp_path):
    """B7: the config a checkpoint stores holds offload_optimizer and sub_group_size too."""
    ck = tmp_path / "ck"
    run_train(TINY + ["--data", corpus(tmp_path), "--steps", "1", "--checkpoint-dir", str(ck),
                      "--set", "zero_optimization.sub_group_size=4096"])
    meta = json.loads((ck / "step-00000001" / "meta.json").read_text())["meta"]
    zo = meta["user"]["config"]["zero_optimization"]
    assert zo["sub_group_size"] == 4096 and zo["offload_optimizer"]["device"] == "none"


def strict_json(line):
    def refuse(const):
        raise ValueError(f"not JSON: {const}")
    return json.loads(line, parse_constant=refuse)


def test_metrics_are_strict_json_on_fp16_overflow(tmp_path):
    """An fp16 overflow step's grad_norm is not finite: the metrics line says null."""
    m = tmp_path / "m.jsonl"
    run_train(TINY + ["--data", corpus(tmp_path), "--steps", "2", "--metrics", str(m),
                      "--set", "fp16.enabled=true", "--set", "fp16.initial_scale_power=40"])
    lines = m.read_text().splitlines()
    rows = [strict_json(x) for x in lines]
    assert [r["skipped"] for r in rows] == [1, 1]  # 2^40 overflows fp16 at once
    assert all(r["grad_norm"] is None for r in rows)
    assert all(isinstance(r["loss"], float) for r in rows)


BAD = [
    ({"model": {"n_layers": 2}}, "model.n_layers: unknown key"),
    ({"model": {"moe": {"expert": 4}}}, "model.moe.expert: unknown key"),
    ({"model": {"moe": {"experts": 4, "top_k": 5}}}, "model.moe.top_k: 5 is more than model.moe.experts 4"),
    ({"model": {"moe": {"experts": 3, "ep": 2}}}, "model.moe.ep: 2 must divide model.moe.experts 3"),
    ({"model": {"moe": {"experts": 4, "capacity_factor": "1"}}}, "model.moe.capacity_factor: expected a number"),
    ({"model": {"moe": {"experts": 4, "ep": 2}}}, "model.moe.ep: 2 does not divide the 1 data-parallel ranks"),
    # the MoE model runs on CUDA since f6a3a79: without a GPU (or a CUDA build) the device is what is refused
    ({"model": {"moe": {"experts": 4}}, "train": {"device": "cuda"}}, "--device cuda: "),
    ({"modle": {}}, "modle: unknown key"),
    ({"model": {"n_head": "4"}}, "model.n_head: expected an integer, got string"),
    ({"train": {"log_every": 0}}, "train.log_every: 0 is out of range"),
    ({"zero_optimization": {"stage": "three"}}, "zero_optimization.stage"),
    ({"zero_optimization": {"stagee": 1}}, "zero_optimization.stagee"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": "fast"}}}, "optimizer.params.lr"),
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}, "train_batch_size: 10 is not divisible"),
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
     "train_batch_size: 16 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 2"),
    ({"scheduler": {"type": "Cosine"}}, "scheduler.type"),
    ({"data": {"path": "/nonexistent/corpus"}}, "data.path"),
    # issue 10
    ({"scheduler": {"type": "WarmupDecayLR"}}, "scheduler.params.warmup_num_steps: 1000 (the default) exceeds"),
    ({"aio": {"block_size": 1.8e19}}, "aio.block_size: expected an integer 4096..1073741824"),
    ({"train": {"comm_timeout_s": -1}}, "train.comm_timeout_s: -1 is out of range"),
    ({"gradient_accumulation_steps": 2147483648}, "gradient_accumulation_steps: 2147483648 is out of range"),
]


@pytest.mark.parametrize("cfg,needle", BAD, ids=[b[1].split(":")[0] for b in BAD])
def test_bad_config_is_rejected_naming_the_key(tmp_path, cfg, needle):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(cfg))
    p = run_train(["--config", str(f), "--steps", "1"], check=False)
    assert p.returncode != 0
    assert needle in p.stderr, p.stderr


def test_duplicate_key_is_rejected_naming_it(tmp_path):
    """The engine's loader refuses duplicate keys; zero-train did take the last one."""
    f = tmp_path / "dup.json"
    f.write_text('{\n  "model": {"n_layer": 2},\n  "model": {"n_layer": 3}\n}\n')
    p = run_train(["--config", str(f), "--print-config"], check=False)
    assert p.returncode != 0 and "duplicate object key" in p.stderr and '"model"' in p.stderr, p.stderr
    assert "line 3" in p.stderr


def test_bad_json_names_the_line(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text('{\n  "model": {\n    "n_layer": 2,\n  }\n}\n')
    p = run_train(["--config", str(f)], check=False)
    assert p.returncode != 0 and "line 4" in p.stderr, p.stderr


def test_cuda_device_without_gpu_is_a_clear_error():
    p = run_train(["--device", "cuda", "--steps", "1"], check=False)
    if p.returncode == 0:
        pytest.skip("this machine has a CUDA GPU")
    assert "--device cuda" in p.stderr and ("no CUDA GPU" in p.stderr or "no CUDA" in p.stderr), p.stderr


@pytest.mark.parametrize("ranks,stage", [(1, 3), (2, 3)])
def test_loss_falls(tmp_path, ranks, stage):
    m = tmp_path / "m.jsonl"
    p = run_train(TINY + ["--data", corpus(tmp_path), "--steps", "40", "--stage", str(stage),
                          "--metrics", str(m), "--log-every", "10"], ranks=ranks)
    rows = metrics(m)
    assert [r["step"] for r in rows] == list(range(1, 41))
    first = sum(r["loss"] for r in rows[:5]) / 5
    last = sum(r["loss"] for r in rows[-5:]) / 5
    # uniform over 256 bytes is ln 256 = 5.55; 40 steps of a tiny model on C source reach < 4
    assert first > 5.0 and last < first - 1.0, (first, last)
    assert "summary:" in p.stdout and f"ZeRO stage {stage} on {ranks} rank" in p.stdout
    assert all(r["tokens_per_s"] > 0 and r["grad_norm"] > 0 for r in rows)
    # piped output: plain lines, no terminal control sequences
    assert "\r" not in p.stdout and "\033" not in p.stdout


def test_param_offload_losses_bitwise(tmp_path):
    """zero_optimization.offload_param cpu and nvme (stage 3, 2 ranks): the same per-step losses,
    bit for bit, as without offload; the swap directory is empty afterwards."""
    nv = tmp_path / "nvme"
    nv.mkdir()
    base = TINY + ["--data", corpus(tmp_path), "--steps", "6", "--stage", "3", "--log-every", "3"]
    losses = {}
    for dev in ("none", "cpu", "nvme"):
        m = tmp_path / f"{dev}.jsonl"
        extra = ["--set", f"zero_optimization.offload_param.device={dev}"]
        if dev == "nvme":
            extra += ["--set", f"zero_optimization.offload_param.nvme_path={nv}"]
        p = run_train(base + extra + ["--metrics", str(m)], ranks=2)
        losses[dev] = [r["loss_text"] for r in metrics(m)]
        if dev != "none":  # the summary names where the parameters were
            line = [x for x in p.stdout.splitlines() if "parameter offload" in x]
            assert line and f"({dev})" in line[0], p.stdout
        if dev == "nvme":  # the recorded order was used to read chunks ahead
            assert int(line[0].split("; ")[1].split(" chunks read ahead")[0]) > 0, line
    assert len(losses["none"]) == 6
    assert losses["cpu"] == losses["none"] and losses["nvme"] == losses["none"], losses
    assert not list(nv.iterdir())


def test_progress_bar_on_a_terminal(tmp_path):
    """On a terminal the bar is redrawn in place (carriage return + erase line)."""
    import pty
    import subprocess
    from train_helpers import exe
    master, slave = pty.openpty()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    p = subprocess.Popen([exe("zero-train")] + TINY + ["--data", corpus(tmp_path), "--steps", "6", "--log-every", "3"],
                         stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    p.wait(timeout=120)
    os.close(master)
    text = out.decode(errors="replace")
    assert p.returncode == 0
    assert "\r\033[2K[" in text and "] 4/6" in text, text[-2000:]
    assert "step      6/6" in text


def test_resume_auto_without_a_checkpoint_starts_fresh(tmp_path):
    ck = tmp_path / "ck"
    p = run_train(TINY + ["--data", corpus(tmp_path), "--steps", "2", "--checkpoint-dir", str(ck), "--resume", "auto"])
    assert "starting from step 0" in p.stdout
    assert (ck / "latest").read_text().strip() == "step-00000002"
    # and --resume auto without a checkpoint dir is a config error
    p = run_train(TINY + ["--data", corpus(tmp_path), "--steps", "2", "--resume", "auto"], check=False)
    assert p.returncode != 0 and "train.checkpoint.dir" in p.stderr


def test_keep_last_keeps_a_fresh_runs_own_checkpoints_and_resume_auto_stays_in_its_run(tmp_path):
    """Issue 10: run A saves steps 1..6 keeping 2; a fresh run B (another seed) saves step 3
    into the same directory. keep_last used to keep the highest step numbers (A's 5 and 6),
    deleting each of B's saves at once, and `--resume auto` then silently continued A. Now
    the newest saves are kept (B's 2 and 3), `latest` is B's, and resume auto refuses a
    checkpoint of another seed by name."""
    ck = tmp_path / "ck"
    base = TINY + ["--data", corpus(tmp_path), "--checkpoint-dir", str(ck), "--checkpoint-every", "1",
                   "--set", "train.checkpoint.keep_last=2"]
    run_train(base + ["--steps", "6", "--seed", "1"])
    p = run_train(base + ["--steps", "3", "--seed", "2"])
    assert "already holds checkpoints" in p.stdout
    assert sorted(x.name for x in ck.iterdir() if x.name.startswith("step-")) == ["step-00000002", "step-00000003"]
    assert (ck / "latest").read_text().strip() == "step-00000003"
    meta = [json.loads((ck / f"step-0000000{i}" / "meta.json").read_text())["meta"] for i in (2, 3)]
    assert [m["user"]["data"]["seed"] for m in meta] == [2, 2]
    assert [m["save_seq"] for m in meta] == [8, 9]  # A saved 6 times before
    # B continues from its own step 3
    p = run_train(base + ["--steps", "4", "--seed", "2", "--resume", "auto"])
    assert "resumed from " + str(ck / "step-00000003") + ": step 3" in p.stdout
    # A's config: the newest save is B's, so auto refuses, naming the key and both values
    p = run_train(base + ["--steps", "8", "--seed", "1", "--resume", "auto"], check=False)
    assert p.returncode != 0
    assert "saved by another run: train.seed 2 there, 1 in this run's config" in p.stderr, p.stderr
    # naming the step directory still loads it (with a warning)
    p = run_train(base + ["--steps", "4", "--seed", "1", "--resume", str(ck / "step-00000003")])
    assert "resumed from " + str(ck / "step-00000003") + ": step 3" in p.stdout
    assert "warning: the checkpoint was trained with train.seed 2, this run uses 1" in p.stdout


def _descendants(root):
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _world_rank_pid(root, rank):
    for pid in _descendants(root):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            comm = open(f"/proc/{pid}/comm").read().strip()
        except OSError:
            continue
        if comm == "zero-train" and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return pid
    return None


def test_a_stopped_rank_ends_the_job_within_the_comm_deadline(tmp_path):
    """Issue 10: the deadline was fixed at 600 s, so a SIGSTOPped rank hung the job for ten
    minutes. With --comm-timeout 3 the other rank fails with the named timeout, does not wait
    in MPI_Finalize for the stopped one, and mpirun ends the job."""
    import shutil
    import signal
    import subprocess
    import time
    from train_helpers import MPIRUN, exe
    if shutil.which("mpirun") is None:
        pytest.skip("needs Open MPI's mpirun")
    m = tmp_path / "m.jsonl"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    p = subprocess.Popen([MPIRUN, "2", exe("zero-train"), "--plain"] + TINY +
                         ["--data", corpus(tmp_path), "--steps", "1000000", "--comm-timeout", "3",
                          "--metrics", str(m), "--log-every", "1000000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stopped = None
    try:
        deadline = time.time() + 120
        while not (m.exists() and len(m.read_text().splitlines()) >= 2) and time.time() < deadline:
            assert p.poll() is None, p.communicate()
            time.sleep(0.05)
        stopped = _world_rank_pid(p.pid, 1)
        assert stopped is not None
        os.kill(stopped, signal.SIGSTOP)
        t0 = time.time()
        out, err = p.communicate(timeout=90)
        elapsed = time.time() - t0
    finally:
        if p.poll() is None:
            p.kill()
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert p.returncode != 0
    assert "zero-train: rank 0, step " in err and "timed out after 3.0 s" in err, err
    # 3 s deadline + mpirun's teardown; the old fixed deadline was 600 s
    assert elapsed < 60, elapsed


def test_check_collectives_names_both_calls_of_diverged_ranks(tmp_path):
    """Issue 10: zero-train's debug mode (--check-collectives) turns on the collective
    fingerprint, so ranks that diverge (here: only rank 0 saves a checkpoint after step 1)
    fail at once with both calls named, instead of waiting out the deadline. The deadline is
    60 s, so a run that ends within it can only have been ended by the fingerprint check."""
    import shutil
    import subprocess
    import time
    from train_helpers import MPIRUN, exe
    if shutil.which("mpirun") is None:
        pytest.skip("needs Open MPI's mpirun")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.pop("ZERO_COLL_FINGERPRINT", None)  # the flag alone must turn the check on
    common = [exe("zero-train"), "--plain"] + TINY + ["--data", corpus(tmp_path), "--steps", "3",
              "--comm-timeout", "60", "--check-collectives", "--checkpoint-dir", str(tmp_path / "ck")]
    t0 = time.time()
    p = subprocess.run([MPIRUN, "1"] + common + ["--checkpoint-every", "1", ":", "-np", "1"] + common,
                       capture_output=True, text=True, env=env, timeout=240)
    elapsed = time.time() - t0
    assert p.returncode != 0
    assert "the ranks called different collectives" in p.stderr, p.stderr
    assert "allgather of" in p.stderr and "as op #" in p.stderr, p.stderr
    assert elapsed < 50, elapsed


def test_check_collectives_is_a_config_key():
    out = run_train(["--print-config"]).stdout
    assert json.loads(out)["train"]["check_collectives"] is False
    out = run_train(["--check-collectives", "--print-config"]).stdout
    assert json.loads(out)["train"]["check_collectives"] is True
    p = run_train(["--set", "train.check_collectives=3", "--print-config"], check=False)
    assert p.returncode != 0 and "train.check_collectives" in p.stderr, p.stderr


def test_engine_finalize_error_names_the_call_once(tmp_path):
    """An engine finalize failure (here: an nvme_path that does not exist) is reported once, with
    its cause; zero-train used to prefix the engine's own "engine finalize:" a second time."""
    missing = tmp_path / "no" / "such" / "dir"
    p = run_train(["--data", str(corpus(tmp_path)), "--steps", "1", "--stage", "3", *TINY,
                   "--set", "zero_optimization.offload_param.device=nvme",
                   "--set", f"zero_optimization.offload_param.nvme_path={missing}"], check=False)
    assert p.returncode != 0
    assert p.stderr.count("engine finalize") == 1, p.stderr
    assert str(missing) in p.stderr, p.stderr


DS_CONFIGS = ["hf_ds_config_zero2.json", "hf_ds_config_zero3.json", "dsexamples_gpt_zero2.json",
              "dsexamples_gpt_zero3_bf16.json"]


@pytest.mark.parametrize("name", DS_CONFIGS)
def test_deepspeed_config_runs_unchanged(tmp_path, name):
    """Issue 11: a DeepSpeed config file (HF Trainer's with "auto" values,
    DeepSpeedExamples-style GPT ones with monitors and profilers) trains as it
    is, the model shape and step count given on the command line, at 2 ranks;
    its accepted-without-effect keys and "auto" values are named in one
    warning per rank, and the loss is finite."""
    path = os.path.join(os.path.dirname(__file__), "..", "train", "ds_configs", name)
    m = tmp_path / "m.jsonl"
    p = run_train(["--config", path, "--data", corpus(tmp_path), "--steps", "2", "--metrics", str(m),
                   "--set", "model.n_layer=1", "--set", "model.n_head=2", "--set", "model.d_model=32",
                   "--set", "model.seq_len=16"], ranks=2)
    warnings = [ln for ln in p.stderr.splitlines() if "libzero[warn]: config:" in ln]
    assert len(warnings) == 2, p.stderr  # one per rank
    rows = metrics(m)
    assert len(rows) == 2 and all(r["loss"] == r["loss"] and r["loss"] < 10 for r in rows)
