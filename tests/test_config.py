"""Config loading and validation: shipped configs, every class of bad config, overrides, the CLI."""

import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from oreal_fast.config import CHOICES, ConfigError, TrainConfig, load_config, validate_stop_word
from oreal_fast.rl_step import RLSettings
from oreal_fast.runtime import Precision
from oreal_fast.train import main

from base_config import BASE, ROOT

CONFIGS = os.path.join(ROOT, "configs")


def _write(tmp_path, extra="", name="cfg.py", base=BASE):
    path = tmp_path / name
    path.write_text(base + textwrap.dedent(extra), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("name", ["a100_40g.py", "oreal_7b.py", "demo.py", "evidence_gpu.py"])
def test_shipped_configs_load(name):
    cfg = load_config(os.path.join(CONFIGS, name))
    assert isinstance(cfg, TrainConfig)
    assert cfg.config_path.endswith(name)
    assert cfg.reference == cfg.actor == cfg.token_level_rm
    assert cfg.gen_global_batch % cfg.prompt_repeat_k == 0


def test_a100_config_has_the_official_hyper_parameters():
    cfg = load_config(os.path.join(CONFIGS, "a100_40g.py"))
    assert cfg.actor == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (cfg.prompt_repeat_k, cfg.gen_global_batch, cfg.gen_max_new, cfg.gen_max_length) == (16, 1024, 14000, 16384)
    lrs = (cfg.actor_lr, cfg.actor_min_lr, cfg.token_level_rm_lr, cfg.token_level_rm_lr_min)
    assert lrs == (5e-7, 1e-7, 2e-6, 4e-7)
    assert (cfg.warmup_steps, cfg.rm_warmup_steps, cfg.total_steps, cfg.actor_freeze_steps) == (10, 10, 90, 10)
    assert (cfg.kl_coef, cfg.kl_type, cfg.reward_shaping_type, cfg.pos_mult_adv) == (0.01, "unbias", "rloo", True)
    assert cfg.data_difficulty_balance_cfg == [((0.0, 0.2), 6), ((0.2, 0.4), 4), ((0.4, 0.6), 4), ((0.6, 0.8), 2)]
    assert cfg.judgers_config["math_judger"]["hosts"] == ["127.0.0.1:10003"]
    assert cfg.checkpoint_every() == 10


def test_7b_variant_inherits_the_base_and_sets_its_model():
    base = load_config(os.path.join(CONFIGS, "a100_40g.py"))
    cfg = load_config(os.path.join(CONFIGS, "oreal_7b.py"))
    assert (cfg.actor, cfg.tp_size) == ("internlm/OREAL-7B-SFT", 4)
    assert cfg.chat_template == base.chat_template and cfg.stop_word == "<|im_end|>"
    assert cfg.total_steps == 90 and cfg.actor_lr == 5e-7
    assert "configs.a100_40g" not in sys.modules


def test_demo_config_is_small_and_rule_only():
    cfg = load_config(os.path.join(CONFIGS, "demo.py"))
    assert cfg.gen_global_batch // cfg.prompt_repeat_k == 4
    assert cfg.total_steps == 4 and cfg.checkpoint_every() == 2
    assert cfg.judgers_config["math_judger"]["rule_only"] is True
    assert cfg.work_dir == "work_dirs/demo"


def test_absent_keys_take_the_official_defaults(tmp_path):
    cfg = load_config(_write(tmp_path))
    assert cfg.reference == "some/model"
    assert cfg.actor_min_lr == cfg.actor_lr == 5e-7
    assert cfg.token_level_rm_lr_min == cfg.token_level_rm_lr == 2e-6
    assert cfg.rm_warmup_steps == cfg.warmup_steps == 1
    assert cfg.rl_global_batch == cfg.gen_global_batch == 16
    assert (cfg.kl_type, cfg.pos_mult_adv, cfg.topk_rescale) == ("unbias", False, False)
    assert cfg.data_judger_mapping == {"math": ["math_judger"]}


def test_private_names_modules_and_functions_are_not_keys(tmp_path):
    cfg = load_config(_write(tmp_path, """
        import math
        def helper(x):
            return 2 * x
        _scale = 3
        gen_max_new = helper(_scale) * 10 + int(math.sqrt(16))
    """))
    assert cfg.gen_max_new == 64


def test_variant_imports_a_sibling_by_name_and_nothing_leaks(tmp_path):
    _write(tmp_path, name="base_cfg.py")
    variant = _write(tmp_path, "from base_cfg import *\ntotal_steps = 3\n", name="variant.py", base="")
    path_before = list(sys.path)
    cfg = load_config(variant)
    assert cfg.total_steps == 3 and cfg.gen_global_batch == 16
    assert "base_cfg" not in sys.modules
    assert sys.path == path_before


@pytest.mark.parametrize(
    "value, total, expected", [(-1, 90, 90), (0.5, 90, 45), (0.25, 90, 22), (10, 90, 10), (2.7, 90, 2)]
)
def test_checkpoint_every_resolves_reference_5_3(tmp_path, value, total, expected):
    cfg = load_config(_write(tmp_path, f"checkpoint_interval = {value}\ntotal_steps = {total}\n"))
    assert cfg.checkpoint_every() == expected


BAD = [
    ("total_stepz = 3", "total_stepz", "did you mean 'total_steps'"),
    ("total_steps = '90'", "total_steps", "expected int"),
    ("kl_coef = 'x'", "kl_coef", "expected float"),
    ("filter_trajectory = 1", "filter_trajectory", "expected bool"),
    ("datasets = []", "datasets", "non-empty"),
    ("datasets = 'missing/file.jsonl'", "datasets", "does not exist"),
    ("gen_global_batch = 18", "gen_global_batch", "not divisible by prompt_repeat_k"),
    ("prompt_repeat_k = 1\ngen_global_batch = 4", "prompt_repeat_k", ">= 2"),
    ("checkpoint_interval = 0.1", "checkpoint_interval", "rounds down to 0"),
    ("checkpoint_interval = 0", "checkpoint_interval", "must be -1, in (0, 1) or >= 1"),
    ("checkpoint_interval = -2", "checkpoint_interval", "must be -1, in (0, 1) or >= 1"),
    ("threshold_rescale = False", "token_level_rm", "threshold_rescale and topk_rescale"),
    ("topk_rescale = True", "topk_rescale", "both True"),
    ("correct_topk_ratio = 0.0", "correct_topk_ratio", "(0, 1]"),
    ("incorrect_threshold = 1.0", "incorrect_threshold", "[0, 1)"),
    ("reward_shaping_type = 'ppo'", "reward_shaping_type", "rloo, grpo"),
    ("kl_type = 'k2'", "kl_type", "kl, unbias, mse"),
    ("actor_min_lr = 1e-6", "actor_min_lr", "above the peak"),
    ("token_level_rm_lr_min = 1e-5", "token_level_rm_lr_min", "above the peak"),
    ("rm_warmup_steps = 4", "rm_warmup_steps", "< total_steps = 4: the cosine phase starts after warmup_steps = 1"),
    ("gen_max_new = 256", "gen_max_new", "< gen_max_length"),
    ("gen_top_p = 0.0", "gen_top_p", "(0, 1]"),
    ("temperature = 0", "temperature", "> 0"),
    ("seed = -1", "seed", ">= 0"),
    ("dtype = 'int8'", "dtype", "auto, bf16, fp16, fp32"),
    ("loss_impl = 'fused'", "loss_impl", "auto, triton, eager"),
    ("trunk_kernels = 'liger'", "trunk_kernels", "auto, triton, eager"),
    ("selective_recompute = 1.5", "selective_recompute", "None or [0, 1]"),
    ("loss_kernel = 'cce'", "loss_kernel", "linear_logprob, fused_oreal_loss"),
    ("attention_backend = 'flash'", "attention_backend", "auto, varlen, sdpa, cudnn, by_length, by_length_runs"),
    ("rl_micro_batch_tokens = -1", "rl_micro_batch_tokens", ">= 0"),
    ("weights_cast_once = False\nmerged_projections = True", "merged_projections", "True needs weights_cast_once = True"),
    ("device = 'tpu'", "device", "auto, cpu, cuda"),
    ("resume = '/no/such/checkpoint'", "resume", "does not exist"),
    ("max_prompts = 0", "max_prompts", ">= 1"),
    ("keep_resume_states = -1", "keep_resume_states", ">= 0"),
    ("cpu_offload = True", "cpu_offload", "not implemented here"),
    ("actor = './no/such/folder'", "actor", "the local path './no/such/folder' does not exist"),
    ("data_difficulty_balance_cfg = [((0.5, 0.2), 3)]", "data_difficulty_balance_cfg", "low < high"),
    ("data_difficulty_balance_cfg = [(0.2, 3)]", "data_difficulty_balance_cfg", "((low, high), copies)"),
    ("data_judger_mapping = dict(math=['llm_judger'])", "data_judger_mapping", "'llm_judger'"),
    ("data_judger_mapping = dict(code=['math_judger'])", "data_judger_mapping", "'math'"),
    ("judgers_config = dict(math_judger=dict(hosts=[]))", "judgers_config", "math_judger"),
    ("judgers_config = dict(math_judger=dict(rule_only=True, bogus=1))", "judgers_config", "bogus"),
    ("reward_fn = 'no_such_reward_module:score'", "reward_fn",
     "module 'no_such_reward_module' cannot be loaded: ModuleNotFoundError"),
    ("reward_fn = 'json:no_such_function'", "reward_fn", "'json' has no attribute 'no_such_function'"),
    ("reward_fn = 'json:dumps'", "reward_fn", "must accept three positional arguments (record, response, gold_answer)"),
    ("reward_fn = 'json:__all__'", "reward_fn", "is a list, not a function"),
    ("reward_fn = './no/such/reward.py:score'", "reward_fn", "reward.py' does not exist"),
    ("reward_fn = 'score'", "reward_fn", "not of the form 'package.module:function' or 'path/to/file.py:function'"),
]


@pytest.mark.parametrize("line, key, why", BAD, ids=[b[0] for b in BAD])
def test_bad_config_names_key_file_and_range(tmp_path, line, key, why):
    path = _write(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    message = str(e.value)
    assert key in message and path in message and why in message


@pytest.mark.parametrize("line, key, why", [
    ("device = 'cpu'\ndtype = 'bf16'", "dtype", "needs a GPU"),
    ("device = 'cpu'\nloss_impl = 'triton'", "loss_impl", "TRITON_INTERPRET=1"),
    ("device = 'cpu'\ntrunk_kernels = 'triton'", "trunk_kernels", "TRITON_INTERPRET=1"),
    ("device = 'cpu'\ngpu_memory_limit_gib = 40", "gpu_memory_limit_gib", "on CPU"),
    ("device = 'cpu'\nattention_backend = 'cudnn'", "attention_backend", "needs a GPU and bf16/fp16 compute, but the "
                                                                        "run is on CPU (use 'auto' or 'sdpa')"),
    ("device = 'cpu'\nattention_backend = 'varlen'", "attention_backend", "the run is on CPU"),
    ("device = 'cpu'\nattention_backend = 'by_length_runs'", "attention_backend", "the run is on CPU"),
])
def test_cpu_only_settings_are_refused_before_anything_loads(tmp_path, monkeypatch, line, key, why):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    path = _write(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert key in str(e.value) and path in str(e.value) and why in str(e.value)


@pytest.mark.parametrize("backend", ["varlen", "cudnn", "by_length", "by_length_runs"])
def test_gpu_attention_backends_are_refused_for_fp32_compute(tmp_path, monkeypatch, backend):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the config's view of a GPU machine
    path = _write(tmp_path, f"device = 'auto'\ndtype = 'fp32'\nattention_backend = {backend!r}\n")
    with pytest.raises(ConfigError, match=f"attention_backend in .*: {backend!r} needs a GPU and bf16/fp16 compute, "
                                          f"but dtype is 'fp32'"):
        load_config(path)


def test_attention_backend_defaults_to_auto_and_sdpa_loads_on_cpu(tmp_path):
    from oreal_fast.model.attention import BACKEND_NAMES

    assert load_config(_write(tmp_path)).attention_backend == "auto"
    assert load_config(_write(tmp_path, "attention_backend = 'sdpa'\n")).attention_backend == "sdpa"
    assert set(CHOICES["attention_backend"]) == set(BACKEND_NAMES)  # the config offers every backend there is


def test_official_keys_that_act_nowhere_here_are_named_at_start(tmp_path):
    from oreal_fast.config import compatibility_notes

    assert compatibility_notes(load_config(os.path.join(CONFIGS, "a100_40g.py"))) == []
    cfg = load_config(_write(tmp_path, "tp_size = 4\nnum_workers = 2\nloss_type = 'per_seq'\n"
                                       "filter_trajectory = False\nrl_global_batch = 8\n"))
    assert compatibility_notes(cfg) == [
        "accepted for compatibility, has no effect here: tp_size = 4 (tensor parallelism; one process holds each "
        "whole model)",
        "accepted for compatibility, has no effect here: num_workers = 2 (prompt DataLoader workers; prompts are "
        "read once at start)",
        "accepted for compatibility, has no effect here: loss_type = 'per_seq' (unused by the official trainer too; "
        "the loss is normalised by global token counts)",
        "accepted for compatibility, has no effect here: rl_global_batch = 8 (the official RL sampler's batch; "
        "every kept sample is trained once per step)",
    ]


def test_missing_required_key(tmp_path):
    base = BASE.replace('actor = "some/model"\n', 'actor_lr = 1e-6\n').replace("actor\n", '"x"\n')
    path = _write(tmp_path, base=base)
    with pytest.raises(ConfigError, match="actor in .*: missing"):
        load_config(path)


def test_error_while_running_the_file_names_its_line(tmp_path):
    path = _write(tmp_path, "x = 1 / 0\n")
    with pytest.raises(ConfigError, match=r"line 15: ZeroDivisionError"):
        load_config(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.py"))


@pytest.mark.parametrize("extra, overrides", [
    ("", {"total_steps": 1}),  # the demo's warmup_steps = 1: one step ends within the warmup
    ("warmup_steps = 10\n", {"total_steps": 1}),  # the official warmup
    ("warmup_steps = 10\nrm_warmup_steps = 12\n", {"total_steps": 11}),  # steps 0..10 all warm up
])
def test_a_run_that_ends_within_the_warmup_loads(tmp_path, extra, overrides):
    """The cosine phase (and its T_max = total_steps - warmup) is reached only after warmup_steps."""
    cfg = load_config(_write(tmp_path, extra), overrides)
    assert cfg.total_steps == overrides["total_steps"]


def test_merged_projections_load_with_weights_cast_once(tmp_path):
    cfg = load_config(_write(tmp_path, "weights_cast_once = True\nmerged_projections = True\n"))
    assert cfg.weights_cast_once and cfg.merged_projections
    default = load_config(_write(tmp_path))
    assert default.weights_cast_once and default.merged_projections  # on by default
    # weights_cast_once off alone turns the merge off with it (the merged GEMMs run on its copies)
    alone = load_config(_write(tmp_path, "weights_cast_once = False\n"))
    assert not RLSettings.from_config(alone, Precision(torch.device("cpu"), torch.float32)).merged_projections
    with pytest.raises(ConfigError, match=r"merged_projections in .* \(set on the command line\): True needs "
                                          r"weights_cast_once = True"):
        load_config(_write(tmp_path, "weights_cast_once = True\n"), {"weights_cast_once": False,
                                                                       "merged_projections": True})


def test_val_datasets_none_on_the_command_line_turns_validation_off(tmp_path):
    val = ('val_datasets = "package://oreal_fast/assets/demo_problems_val.jsonl"\n'
           "val_before_train = True\nval_interval = 2\n")
    path = _write(tmp_path, val)
    cfg = load_config(path, {"val_datasets": None})
    assert (cfg.val_datasets, cfg.val_before_train, cfg.val_interval) == (None, False, 0)
    # asking for validation on the same command line, or in a file without held-out problems, is still an error
    with pytest.raises(ConfigError, match=r"val_before_train in .* \(set on the command line\): True asks for"):
        load_config(path, {"val_datasets": None, "val_before_train": True})
    with pytest.raises(ConfigError, match=r"val_interval in .*: 2 asks for validation but val_datasets is None"):
        load_config(_write(tmp_path, val.replace("val_datasets = ", "_unused = ")))


def test_overrides_apply_and_are_checked(tmp_path):
    path = _write(tmp_path)
    assert load_config(path, {"total_steps": 3, "gen_global_batch": 8}).rl_global_batch == 8
    with pytest.raises(ConfigError, match=r"total_steps in .* \(set on the command line\): expected int"):
        load_config(path, {"total_steps": "ten"})
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(path, {"not_a_key": 1})


class _Tokenizer:
    """Stands in for a tokenizer: <|im_end|> is one special token, other text one id per char."""

    def encode(self, text, add_special_tokens=True):
        return [2] if text == "<|im_end|>" else [ord(ch) for ch in text]


@pytest.mark.parametrize("word, ok", [("<|im_end|>", True), ("</s>", False)])
def test_stop_word_must_be_one_token(tmp_path, word, ok):
    cfg = load_config(_write(tmp_path), {"stop_word": word})
    if ok:
        assert validate_stop_word(cfg, _Tokenizer()) == 2
    else:
        with pytest.raises(ConfigError, match=r"stop_word in .*cfg\.py: '</s>' encodes to 4 tokens"):
            validate_stop_word(cfg, _Tokenizer())


def test_smoke_is_one_step_without_validation_or_resume_states_and_flags_beside_it_win(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setitem(sys.modules, "oreal_fast.trainer", types.SimpleNamespace(train=lambda cfg, stop: seen.append(cfg)))
    path = _write(tmp_path, 'val_datasets = "package://oreal_fast/assets/demo_problems_val.jsonl"\n'
                            "val_before_train = True\nwarmup_steps = 10\ntotal_steps = 90\n")
    main([path, "--smoke"])
    main([path, "--smoke", "--total_steps", "2"])
    main([path])
    (smoke, two, full) = seen
    assert (smoke.total_steps, smoke.val_datasets, smoke.keep_resume_states) == (1, None, 0)
    assert (two.total_steps, two.val_datasets) == (2, None)
    assert (full.total_steps, full.keep_resume_states) == (90, 2) and full.val_datasets is not None


def test_cli_parses_overrides_like_fire_and_calls_the_trainer(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setitem(sys.modules, "oreal_fast.trainer", types.SimpleNamespace(train=lambda cfg, stop: seen.append(cfg)))
    main([_write(tmp_path), "--total_steps", "3", "--work_dir", "out/x",
          "--token_level_rm", "None", "--actor_lr", "1e-6"])
    (cfg,) = seen
    assert (cfg.total_steps, cfg.work_dir, cfg.token_level_rm, cfg.actor_lr) == (3, "out/x", None, 1e-6)


@pytest.mark.parametrize("args, key", [
    (["--total_stepz", "3"], "total_stepz"),
    (["--gen_global_batch", "15"], "gen_global_batch"),
    (["--checkpoint_interval", "0.01"], "checkpoint_interval"),
    (["--reward_fn", "no_such_reward_module:score"], "reward_fn"),
    (["--reward_fn", "json:no_such_function"], "reward_fn"),
    (["--reward_fn", "json:dumps"], "reward_fn"),
])
def test_cli_exits_2_with_one_line_naming_the_key(tmp_path, args, key):
    path = _write(tmp_path)
    run = subprocess.run([sys.executable, "-m", "oreal_fast.train", path, *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 2
    assert key in run.stderr and path in run.stderr
    assert "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("error, prefix", [("config", "config error: stop_word"), ("data", "data error: p.jsonl:3")])
def test_cli_turns_errors_raised_during_the_run_into_exit_2(tmp_path, monkeypatch, capsys, error, prefix):
    from oreal_fast.data import DataError

    def train(cfg, stop):
        if error == "config":
            raise ConfigError("stop_word in cfg.py: x")
        raise DataError("p.jsonl:3: field 'question' is missing")

    monkeypatch.setitem(sys.modules, "oreal_fast.trainer", types.SimpleNamespace(train=train))
    with pytest.raises(SystemExit) as e:
        main([_write(tmp_path)])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith(prefix)
