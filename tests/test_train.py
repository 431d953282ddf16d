"""Post-training: the split, self-generated data, conversation files, rewards, SFT and GRPO on
the tiny real model, and the before/after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rule_cases import CASES, CHATML

pytest.importorskip("trl", reason="pip install 'userturn[train]'")
pytest.importorskip("peft", reason="pip install 'userturn[train]'")

from userturn.backends.fake import ScriptedBackend  # noqa: E402
from userturn.cli.main import main  # noqa: E402
from userturn.data import load_dataset  # noqa: E402
from userturn.errors import DatasetError  # noqa: E402
from userturn.records import LABELS, Case, Item, Label  # noqa: E402
from userturn.train.data import conversations_file, self_generated, split_dataset  # noqa: E402
from userturn.train.rewards import CollabReward, ProbeReward  # noqa: E402
from userturn.train.settings import RLSettings, SFTSettings  # noqa: E402
from userturn.train.trainers import TrainingError, evaluate_checkpoint, run_rl, run_sft  # noqa: E402

QUERY = "Tom has 3 boxes of 12 pencils. He gives away 10 pencils. How many are left?"
ANSWER = "He has 3 x 12 = 36 pencils. After giving away 10, he has 36 - 10 = 26 pencils left.\n#### 26"
FOLLOW_UP = "Why did you multiply 3 by 12 to get the 36 pencils?"
DRIFT = "He has 36 pencils, so 36 - 10 = 26 pencils are left. Is there anything else I can help with?"


@pytest.fixture
def conversation_file(tmp_path: Path) -> Path:
    rows = [
        {"id": "a", "conversations": [
            {"from": "human", "value": "What is 2+3?"}, {"from": "gpt", "value": "2+3 = 5."},
            {"from": "human", "value": "Why is it not 6?"},
            {"from": "gpt", "value": "Because 2+3 is 5, one less than 6."}]},
        {"id": "b", "messages": [
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7 is prime."},
            {"role": "user", "content": "Is 9 prime too?"}]},
        {"prompt": [{"role": "user", "content": "Say hi."}], "chosen": "Hi there!"},
    ]
    path = tmp_path / "conversations.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_split_holds_out_exactly_the_items_the_probe_evaluates(gsm_file: Path) -> None:
    split = split_dataset(f"gsm8k:{gsm_file}", eval_items=2, train_items=3, seed=0)
    probed = load_dataset(f"gsm8k:{gsm_file}", limit=2)
    assert [i.id for i in split.eval.items] == [i.id for i in probed.items]
    assert {i.id for i in split.train.items}.isdisjoint(i.id for i in split.eval.items)
    assert len(split.train.items) == 3


def test_a_training_item_repeating_an_evaluation_query_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "dup.jsonl"
    rows = [{"question": "What is 2+2?", "answer": "#### 4"},
            {"question": "What is 3+3?", "answer": "#### 6"},
            {"question": "What is 2+2?", "answer": "#### 4"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    split = split_dataset(f"gsm8k:{path}", eval_items=1, train_items=2, seed=0)
    assert [i.query for i in split.train.items] == ["What is 3+3?"]
    assert len(split.dropped) == 1
    with pytest.raises(DatasetError, match="none is left for training"):
        split_dataset(f"gsm8k:{path}", eval_items=3, train_items=2, seed=0)


def _scripted_model(request) -> str:
    """Right on the pencils item, wrong on the others; follow-ups after the pencils answer,
    drift and thanks elsewhere; a next answer to any follow-up."""
    prompt = request.prompt
    if prompt.rstrip().endswith("assistant"):  # an answer is asked for
        if FOLLOW_UP in prompt:
            return "Because there are 3 boxes with 12 pencils in each.<|im_end|>"
        if "Why is it 7" in prompt:  # the other follow-up: a next answer to it too
            return "Because 7 is what I counted.<|im_end|>"
        return (ANSWER if "pencils" in prompt else "It is 7.\n#### 7") + "<|im_end|>"
    if "pencils" in prompt:
        return (FOLLOW_UP if request.seed % 2 else DRIFT) + "<|im_end|>"
    return f"Why is it 7 and not {request.seed % 50}?<|im_end|>"


def test_self_generated_data_keeps_follow_ups_and_protects_accuracy(tmp_path: Path) -> None:
    items = (Item("pencils", ({"role": "user", "content": QUERY},), "26"),
             Item("chairs", ({"role": "user", "content": "There are 7 rows of 8 chairs. How many "
                                                        "chairs are there?"},), "56"))
    from userturn.data import Dataset
    from userturn.data.gsm8k import GSM8KScorer

    dataset = Dataset("mini", items, GSM8KScorer(), "hand-made")
    backend = ScriptedBackend(_scripted_model)
    # The probe run training makes: the settings' budgets, the data's temperature and samples.
    exp = SFTSettings(max_tokens=64, user_max_tokens=32).experiment(
        backend.spec, dataset.name, tmp_path / "selfgen", limit=None, temperatures=[1.0],
        samples=6)
    conversations, stats = self_generated(backend, dataset, exp, next_answer=True,
                                          mix_correct=True)
    assert stats.items == 2 and stats.answers_correct == 1 and stats.user_turns == 12
    follow_ups = [c for c in conversations if len(c) > 2]
    single = [c for c in conversations if len(c) == 2]
    assert stats.kept_follow_ups == len(follow_ups) == stats.labels["follow_up"] > 0
    for conversation in follow_ups:
        assert [m["role"] for m in conversation] == ["user", "assistant", "user", "assistant"]
        assert conversation[2]["content"] in (FOLLOW_UP,) or "Why is it 7" in conversation[2]["content"]
        # A wrong answer stays as context only; a right one is trained on.
        wrong = "It is 7" in conversation[1]["content"]
        assert (conversation[1].get("loss") is False) == wrong
        assert conversation[3]["content"].startswith("Because")
    # Drift was sampled and rejected; the one correct single-turn answer is mixed in.
    assert stats.labels.get("assistant_drift", 0) > 0
    assert DRIFT not in json.dumps(conversations)
    assert single == [[{"role": "user", "content": QUERY},
                       {"role": "assistant", "content": ANSWER}]]
    # The generation is a stored probe run: the same call again makes no model call.
    calls = backend.calls
    self_generated(backend, dataset, exp, next_answer=False, mix_correct=False)
    assert backend.calls == calls


def test_conversation_files_in_every_supported_shape(conversation_file: Path) -> None:
    conversations = conversations_file(conversation_file)
    assert [[m["role"] for m in c] for c in conversations] == [
        ["user", "assistant", "user", "assistant"], ["user", "assistant", "user"],
        ["user", "assistant"]]
    assert conversations[2][1]["content"] == "Hi there!"


def test_a_bad_conversation_row_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n"
                    + json.dumps({"messages": [{"role": "wizard", "content": "x"}]}) + "\n",
                    encoding="utf-8")
    with pytest.raises(DatasetError, match=r"bad.jsonl line 2: messages\[0\].role"):
        conversations_file(path)


def test_probe_reward_on_hand_made_turns(tiny_backend) -> None:
    tokenizer = tiny_backend.tokenizer
    reward = ProbeReward(tokenizer, ("<|im_end|>",), "<|im_start|>assistant", free_tokens=200)
    turns = [FOLLOW_UP, QUERY, DRIFT, "Thanks, that helps!", "<|im_start|>assistant\nSure, 26."]
    ids = [tokenizer(t + "<|im_end|>", add_special_tokens=False)["input_ids"] for t in turns]
    rewards = reward([""] * 5, turns, ids, query=[QUERY] * 5, answer=[ANSWER] * 5)
    assert rewards == [1.0, -1.0, -1.0, 0.0, -1.0]
    # Past the free budget every token costs: a follow-up padded with rambling scores less.
    strict = ProbeReward(tokenizer, ("<|im_end|>",), length_penalty=0.01, free_tokens=4)
    score, label = strict.score(QUERY, ANSWER, FOLLOW_UP, FOLLOW_UP + "<|im_end|>", tokens=24)
    assert label == "follow_up" and score == pytest.approx(1.0 - 0.2)


def test_probe_reward_pays_each_label_what_the_taxonomy_says(tiny_backend) -> None:
    """+1 for a follow-up label, each penalised label its own penalty, 0 for the rest."""
    class Says:  # the classifier's verdict, scripted: the reward is what is under test
        label = ""

        def classify(self, case: Case) -> Label:
            return Label(self.label, "scripted")

    says = Says()
    reward = ProbeReward(tiny_backend.tokenizer, ("<|im_end|>",), classifier=says,
                         restatement_penalty=0.5, drift_penalty=2.0, free_tokens=100)

    def paid(label: str) -> float:
        says.label = label
        return reward.score(QUERY, ANSWER, "text", "text", tokens=1)[0]

    assert {label: paid(label) for label in LABELS} == {
        "follow_up": 1.0, "generic": 0.0, "new_query": 0.0, "restatement": -0.5,
        "assistant_drift": -2.0, "meta": 0.0, "empty": 0.0}


def test_collab_reward_adds_correctness_follow_ups_and_a_token_cost() -> None:
    item = Item("pencils", ({"role": "user", "content": QUERY},), "26")
    from userturn.data.gsm8k import GSM8KScorer

    simulated = ScriptedBackend(lambda r: (FOLLOW_UP if r.seed % 2 else "Thanks!") + "<|im_end|>")
    reward = CollabReward({"pencils": item}, GSM8KScorer(), simulated, follow_weight=0.5,
                          token_weight=0.01, samples=8)
    rate = reward.follow_up_rate(item, ANSWER)
    assert simulated.calls == 8  # the frozen model wrote 8 user turns; follow-ups where odd
    assert rate == sum(r.seed % 2 for r in simulated.requests) / 8
    # Every simulated turn opens a user turn after the answer being rewarded.
    assert all(r.prompt.endswith(f"{ANSWER}<|im_end|>\n<|im_start|>user\n")
               for r in simulated.requests)
    right, wrong = reward([QUERY] * 2, [ANSWER, "#### 30"], [[1] * 10, [1] * 10],
                          item_id=["pencils", "pencils"])
    assert right == pytest.approx(1.0 + 0.5 * rate - 0.1)
    assert wrong == pytest.approx(0.0 + 0.5 * reward.follow_up_rate(item, "#### 30") - 0.1)


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def test_sft_two_steps_on_the_tiny_model_then_before_after(tmp_path: Path, gsm_file: Path,
                                                           conversation_file: Path) -> None:
    out = tmp_path / "sft"
    settings = SFTSettings(model="tiny", dataset=f"gsm8k:{gsm_file}", eval_items=2,
                           train_items=3, data=str(conversation_file), max_steps=2, batch_size=2,
                           max_tokens=12, user_max_tokens=6, temperatures=[0.0, 1.0], samples=2,
                           loss_on="user", output=out)
    outcome = run_sft(settings, log=lambda _: None)
    manifest = json.loads((out / "manifest.json").read_text())
    training = manifest["training"]
    assert training["steps"] == 2 and training["loss_first"] > 0
    from userturn.backends.models import resolve_model

    assert manifest["base_model"] == "tiny"
    assert manifest["base_revision"] == resolve_model("tiny").revision
    assert manifest["data"]["sha256"].startswith("sha256:") and manifest["data"]["examples"] == 2
    assert manifest["items"]["eval"] == [i.id for i in load_dataset(f"gsm8k:{gsm_file}", limit=2).items]
    assert manifest["settings"]["loss_on"] == "user" and manifest["seed"] == 0
    # LoRA's B matrices start at zero: after training they are not, and the adapter reloads.
    weights = _weights(out / "adapter")
    assert any(float(t.abs().sum()) > 0 for k, t in weights.items() if "lora_B" in k)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny").path)
    reloaded = PeftModel.from_pretrained(base, str(out / "adapter"))
    state = {n: p for n, p in reloaded.named_parameters() if "lora_B" in n}
    assert len(state) == sum("lora_B" in k for k in weights) > 0
    for key, saved in weights.items():  # the reloaded adapter holds the trained values
        if "lora_B" in key:
            match = [p for n, p in state.items() if n.replace(".default", "").endswith(
                key.split("base_model.model.", 1)[-1])]
            assert len(match) == 1 and match[0].detach().equal(saved)
    # The before/after probed both models on the held-out items, paired.
    result = outcome.before_after
    assert result is not None
    comparisons, accuracy = result.by_labeller["cascade"]
    assert {c.temperature for c in comparisons} == {0.0, 1.0}
    assert all(c.follow_up.items == 2 for c in comparisons) and accuracy[0].accuracy.items == 2
    # The held-out rule set, which played no part in training, measured the same turns.
    assert list(result.by_labeller) == ["cascade", "heldout-rules (played no part in training)"]
    held = result.by_labeller["heldout-rules (played no part in training)"][0]
    assert [c.follow_up.items for c in held] == [c.follow_up.items for c in comparisons]
    page = (out / "before_after.html").read_text()
    assert "played no part in training" in page
    assert (out / "before_after.1.html").exists()
    rows = json.loads((out / "manifest.json").read_text())["evaluation"]["rows"]
    assert {r["measure"] for r in rows} == {"follow_up_rate", "accuracy"}
    # A finished folder is never trained over; `train eval` repeats the before/after.
    with pytest.raises(TrainingError, match="train eval"):
        run_sft(settings, log=lambda _: None)
    again = evaluate_checkpoint(out)
    assert again.by_labeller["cascade"][0][0].follow_up == comparisons[0].follow_up


def test_train_eval_refuses_when_the_held_out_items_changed(tmp_path: Path, gsm_file: Path,
                                                            conversation_file: Path) -> None:
    out = tmp_path / "sft"
    settings = SFTSettings(model="tiny", dataset=f"gsm8k:{gsm_file}", eval_items=2,
                           train_items=3, data=str(conversation_file), max_steps=1,
                           batch_size=2, evaluate=False, output=out)
    run_sft(settings, log=lambda _: None)
    rows = gsm_file.read_text().splitlines()
    gsm_file.write_text("\n".join([rows[1], rows[0], *rows[2:]]) + "\n")
    with pytest.raises(TrainingError, match="not those the manifest recorded"):
        evaluate_checkpoint(out)


def test_grpo_one_step_with_prompts_ending_in_an_open_user_header(tmp_path: Path,
                                                                  gsm_file: Path,
                                                                  monkeypatch) -> None:
    seen: list[str] = []
    original = ProbeReward.__call__

    def recording(self, prompts, *args, **kwargs):
        seen.extend(prompts)
        return original(self, prompts, *args, **kwargs)

    monkeypatch.setattr(ProbeReward, "__call__", recording)
    settings = RLSettings(model="tiny", dataset=f"gsm8k:{gsm_file}", eval_items=2,
                          train_items=2, max_steps=1, num_generations=2, max_tokens=12,
                          user_max_tokens=6, evaluate=False, output=tmp_path / "rl")
    outcome = run_rl(settings, log=lambda _: None)
    assert outcome.manifest["training"]["steps"] == 1
    assert outcome.manifest["settings"]["beta"] == 0.04  # the KL anchor is on by default
    assert seen and all(p.endswith("<|im_end|>\n<|im_start|>user\n") for p in seen)
    assert (tmp_path / "rl" / "model" / "config.json").exists()


def test_train_cli_rejects_bad_settings_before_any_work(tmp_path: Path, capsys) -> None:
    out = tmp_path / "never"
    code = main(["train", "sft", "--eval-items", "0", "--output", str(out)])
    assert code == 2 and not out.exists()
    assert "eval_items" in capsys.readouterr().err


def test_the_gpu_training_benchmark_runs_its_smoke_size_on_cpu() -> None:
    """The GPU script cannot run in CI; its tiny CPU size keeps it from rotting."""
    import subprocess
    import sys

    root = Path(__file__).parent.parent
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "gpu_train.py"), "--size", "tiny", "--device",
         "cpu", "--steps", "1", "--seq-len", "64", "--batch-size", "2", "--new-tokens", "4"],
        capture_output=True, text=True, timeout=300, env={**__import__("os").environ,
                                                          "PYTHONPATH": str(root / "src")})
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["lora"] and summary["train_tokens_per_s"] > 0
    assert summary["generate_tokens_per_s"] > 0


def test_the_held_out_rule_set_is_a_usable_second_labeller() -> None:
    """On the hand-labelled table of the rules' tests (labels.md), the held-out set's follow-up
    calls stay usable: measured 9 of 14 right (precision), 9 of 17 found (recall)."""
    from userturn.records import Case
    from userturn.train.heldout import HeldOutRules

    labeller = HeldOutRules()
    pairs = [(c.expected == "follow_up", labeller.classify(Case(
        c.query, c.answer, c.turn, c.raw or c.turn, CHATML)).label == "follow_up")
        for c in CASES if c.expected is not None]
    hits = sum(truth and said for truth, said in pairs)
    assert hits / sum(said for _, said in pairs) >= 0.6
    assert hits / sum(truth for truth, _ in pairs) >= 0.5


def test_rloo_one_step_with_the_collab_reward(tmp_path: Path, gsm_file: Path,
                                              monkeypatch) -> None:
    """The assistant-side path: prompts open an ASSISTANT turn, and the reward simulates user
    turns with the frozen base after each sampled answer."""
    seen: list[str] = []
    original = CollabReward.follow_up_rate

    def recording(self, item, answer):
        seen.append(answer)
        return original(self, item, answer)

    monkeypatch.setattr(CollabReward, "follow_up_rate", recording)
    settings = RLSettings(model="tiny", dataset=f"gsm8k:{gsm_file}", eval_items=2, train_items=2,
                          algorithm="rloo", reward="collab", max_steps=1, num_generations=2,
                          max_tokens=8, user_max_tokens=4, collab_samples=1, evaluate=False,
                          output=tmp_path / "rloo")
    outcome = run_rl(settings, log=lambda _: None)
    assert outcome.manifest["training"]["steps"] == 1
    assert outcome.manifest["data"]["reward"] == "collab" and len(seen) == 2


def test_training_items_never_share_a_template_with_held_out_items() -> None:
    """GSM-Symbolic items of one template differ only in names and numbers: keep them apart."""
    split = split_dataset("gsm_symbolic", eval_items=20, train_items=40, seed=0)
    held = {item.metadata["template"] for item in split.eval.items}
    assert len(split.train.items) == 40 and split.dropped  # seed 0 draws some templates twice
    assert all(item.metadata["template"] not in held for item in split.train.items)


def test_a_conversation_whose_roles_do_not_alternate_is_named(tmp_path: Path) -> None:
    path = tmp_path / "two_users.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "a"},
                                             {"role": "assistant", "content": "b"}]}) + "\n"
                    + json.dumps({"conversations": [{"from": "human", "value": "a"},
                                                    {"from": "human", "value": "b"}]}) + "\n",
                    encoding="utf-8")
    with pytest.raises(DatasetError, match="two_users.jsonl line 2: .*two user messages"):
        conversations_file(path)


def test_the_saved_checkpoint_keeps_the_base_end_of_sequence(tiny_backend) -> None:
    """RL adds the turn's stop tokens to generation; the checkpoint must not keep them."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from userturn.backends.models import resolve_model
    from userturn.train.trainers import restore_stop, stop_on_turn_end

    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny").path)
    model.generation_config.eos_token_id = 3  # an EOS other than the user turn's stop
    original = stop_on_turn_end(model, tiny_backend.tokenizer, ("<|im_end|>",), lambda _: None)
    end_of_turn = tiny_backend.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert original == 3 and model.generation_config.eos_token_id == sorted({3, end_of_turn})
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules="all-linear"))
    restore_stop(wrapped, original)
    assert wrapped.merge_and_unload().generation_config.eos_token_id == 3
