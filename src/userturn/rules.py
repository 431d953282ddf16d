"""A deterministic, offline, rule-based classifier of generated user turns.

The rules follow /work/shared/labels.md. They label only the CLEAR cases and return an undecided
``Label`` (``label=None``) for everything else, so that an LLM judge labels those later: a wrong
confident label costs more than an undecided one. Deliberately left undecided: word salad and
fluent gibberish, emoji-only replies, turns that mix a user opening with an assistant-style
continuation, role-labelled scripts ("User: ..."), short replies that may answer a question the
assistant asked, "what if" variations of the query, partial paraphrases of the query, questions
that share some but not enough content with the answer, requests to continue an answer that does
not look cut off, and any non-English turn whose words the rules cannot compare.

Rules run in a fixed order; the first that fires wins (see ``_RULES``). Standard library only.
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from userturn.records import Case, Label

Verdict = tuple["str | None", str]  # (label, or None for undecided; the rule that fired)

_ROLES = r"(?:user|assistant|system|model|tool|developer|human)"
_SPECIAL = re.compile(
    rf"<\|im_start\|>{_ROLES}?|<\|start_header_id\|>{_ROLES}?<\|end_header_id\|>|<start_of_turn>"
    rf"{_ROLES}?|<\|start\|>{_ROLES}?|<\|[^<>|\n]{{1,40}}\|>|</?s>|</?think>|\[/?INST\]|<</?SYS>>"
    r"|<(?:bos|eos|pad|unk|end_of_turn|mask)>", re.I)
_CJK = re.compile(r"([\u3400-\u9fff])")  # Han characters: one token each
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
_NUM = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
_NUMBER_WORDS.update({"thirty": "30", "forty": "40", "fifty": "50", "hundred": "100", "dozen": "12"})
_STOP = set("""a an the and or but if then so of to in on at by for with from about as into than
too very is are was were be been being am do does did done have has had having i me my mine we us
our you your yours he him his she her it its they them their this that these those there here what
which who whom whose when where why how many much more most some any all each every no not nor
only own same other such can could will would shall should may might must just also now up down
out over under again once very s t don't without within onto upon via per i'm it's that's let's what's how's there's get got go
de la el los las que y en un una es por para con se le les des et est une du der die das und ist
ein eine zu mit il lo di che non""".split())
_GENERIC = set("""thanks thank thx ty you so much a lot for the your help helping helpful great ok
okay k alright got it i see cool nice awesome perfect good very really that this makes make sense
was is clear clearer understand understood now wow amazing excellent appreciate appreciated sure
yes yeah yep fine noted oh ah hmm can could would explain more elaborate further please tell me
about detail details brilliant fantastic wonderful lovely sounds glad to know learned something new
interesting super answer response explanation information info all right that's it's gracias muchas
merci beaucoup danke vielen dank grazie obrigado спасибо 谢 好 ありがとう 감사합니다""".split())
_SHORT_OK = {"ok", "k", "no", "hi", "oh", "ty", "ya", "好", "谢", "是"}
_REPLY_WORDS = {"yes", "yeah", "yep", "sure", "please", "no", "ok", "okay", "alright", "fine"}

_HEADERS = ("<|im_start|>assistant", "<|start_header_id|>assistant<|end_header_id|>",
            "<|assistant|>", "<start_of_turn>model", "<|start|>assistant")
_ROLE_ASSISTANT = re.compile(r"^\W{0,4}(?:assistant|ai|chatbot|bot|gpt)\s*(?::|：|\n)", re.I)
_ROLE_LABEL = re.compile(r"^\W{0,4}(?:user|human|me|customer|student|question|q|"
                         r"follow-?up(?: question)?)\s*(?::|：)", re.I)
_DRIFT_OPEN = re.compile(
    r"^\W{0,4}(?:(?:sure|certainly|of course|absolutely|okay|great)[!,.]?\s+(?:here(?:'s| is| are)"
    r"|i(?:'d| would) be (?:happy|glad)|i can|let'?s|let me|i'll)|(?:let'?s|let us) (?:solve|break"
    r"|calculate|compute|work|think|figure|go through|start|find|determine|analy[sz]e|tackle|begin"
    r"|approach)|to (?:solve|find|determine|calculate|compute|figure out|answer|work out)\b|step 1\b"
    r"|here(?:'s| is| are) (?:the|a) (?:step-by-step |detailed |complete |full |corrected )?"
    r"(?:solution|answer|explanation|breakdown|calculation|steps)|(?:great|good) question"
    r"|you(?:'re| are) (?:very )?welcome|glad (?:i could|to) help|as an ai\b"
    r"|i apologi[sz]e for (?:the|any|my))", re.I)
_DRIFT_ANY = re.compile(
    r"i hope (?:this|that) helps|let me know if you (?:have|need|want|'d like|would like)|feel free "
    r"to (?:ask|reach out|let me know)|is there anything else (?:i can|you)|happy to help", re.I)
_ANSWER_MARK = re.compile(r"####\s*\$?-?\d|\\boxed\{|\b(?:so|therefore|thus|hence),? the (?:final )?"
                          r"answer is|\bthe final answer is|^answer\s*:", re.I)
_EQUATION = re.compile(r"\d\s*(?:[-+*/×÷x]\s*\$?\d[\d,.]*\s*)+=\s*\$?-?\d")
_CONNECTIVE = re.compile(r"^\W{0,4}(?:so|therefore|thus|hence|first|next|then|finally|now|step \d|"
                         r"the (?:final )?answer is)\b", re.I)
_META = re.compile(
    r"(?:^|[.!?:]\s+|\n)\W{0,4}(?:(?:so|okay|ok|well|hmm|alright),?\s+){0,2}the user(?:'s)? (?:is asking|is "
    r"requesting|is looking|is trying|is interested|is curious|wants|wanted|asks|asked|has asked|"
    r"seems|needs|would like|might|may|would|could|likely|query|question|request|response|has provided|"
    r"provided|has given|gave|has shared)\b"
    r"|\bin this conversation\b|\bthe assistant(?:'s)? (?:answer|response|solution|has|is|provided|"
    r"gave|explained|answered|correctly|incorrectly|should|did)\b|^\W{0,4}the assistant\b"
    r"|here(?:'s| is) (?:a|an|one) (?:possible|potential|sample|example|likely|realistic|natural|"
    r"plausible) (?:user |follow-up |follow up )?(?:response|reply|question|follow-up|message|turn)"
    r"|here(?:'s| is) (?:a|the) user(?:'s)? (?:response|reply|question|follow-up|message|turn)"
    r"|as (?:the|a) user,? i\b|^\W{0,4}(?:possible |sample |next )?user (?:response|reply|turn|"
    r"message)\s*:|^\W{0,4}possible follow-?up(?: question)?\s*:|^\W{0,4}you are (?:a|an) (?:helpful"
    r"|friendly|expert|knowledgeable|ai|large language|smart|honest|harmless)|^\W{0,4}(?:###\s*)?"
    r"(?:system|instructions?)\s*:|\b(?:i|we) (?:need|should|have|want) to (?:respond|reply|write|"
    r"generate|come up with|craft) (?:a|an|the|as)\b|\bhow (?:should|do|would) i respond\b", re.I)
_USER_CUE = re.compile(r"\b(?:you|your|you're|thanks|thank|i think|i thought|i believe|i got|i get|"
                       r"i don't|i'm not sure|i'm confused|wait|hmm|why|how come|great job|good job|"
                       r"well done|correct|you got it)\b", re.I)
_REQUEST = re.compile(
    r"\?|\b(?:why|how|can you|could you|would you|please|i think|should be|shouldn't|wrong|mistake|"
    r"incorrect|not right|don't understand|you said|you wrote|you forgot|you missed|what if|show me|"
    r"explain)\b|^\W{0,4}(?:show|explain|tell|give|write|redo|try|use|add|convert|rewrite|list)\b",
    re.I)
_REF_CUE = re.compile(
    r"\b(?:you|your|why|how come|how did|where did|where does|what does|that|this|those|these|it|"
    r"step|wait|but|shouldn't|should be|i think|i got|i get|i thought|wrong|mistake|incorrect|error|"
    r"instead|mean|explain|clarify|por qué|pourquoi|warum|perché)\b|为什么", re.I)
_STRONG_REF = re.compile(r"\b(?:why|how come|how did|you said|you wrote|you mentioned|you used|"
                         r"your|that|this|those|these|wait|but|instead|wrong|mistake|mean)\b", re.I)
_DISPUTE = re.compile(r"\b(?:i think|i believe|i got|should be|shouldn't|wrong|mistake|incorrect|"
                      r"not right|isn't it|instead)\b", re.I)
_CUTOFF = re.compile(r"\b(?:stopped|cut off|got cut|cut short|mid-?sentence|incomplete|unfinished|"
                     r"didn't finish|not finished|continue|finish|keep going|go on|rest of|complete "
                     r"(?:it|the)|what's next|next step)\b", re.I)
_NEW_START = re.compile(r"^\W{0,4}(?:(?i:what|how|who|where|when|which|why|can|could|would|is|are|"
                        r"do|does|write|tell|give|list|describe|explain|translate|create|generate|"
                        r"compose|name|suggest|recommend|calculate|solve|find|if|a|an)|[A-Z][a-z]+ "
                        r"(?:has|had|is|was|buys|bought|wants|earns|reads|runs))\b")
_DEICTIC = re.compile(r"\b(?:this|that|these|those|it|them|same|instead|again|above|previous|your|"
                      r"you said|what about|what if|how about)\b", re.I)  # looked for in 8 words
_REACTS = re.compile(r"\b(?:steps?|answer|solution|result|explain|explanation|calculation|example|"
                     r"did you|you (?:made|got|did|said|wrote|used|forgot|missed|mean)|mistake|wrong|"
                     r"incorrect|i got|i think|should be|correct|right|again|instead|also|else)\b",
                     re.I)
_NOT_ARTIFACT = set("answer step solution result total explain question help thanks calculation "
                    "problem first second third final number example correct wrong right mean "
                    "understand sure more again part".split())


def _strip_special(text: str) -> str:
    return _SPECIAL.sub(" ", unicodedata.normalize("NFKC", text).replace("’", "'")).strip()


def _words(text: str) -> list[str]:
    return _WORD.findall(_CJK.sub(r" \1 ", text.lower()))


def _stem(word: str) -> str:
    for suffix in ("'s", "ing", "ed", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 2:
            word = word[: -len(suffix)]
            break
    return (word[:-1] if len(word) >= 3 and word.endswith("e") else word)[:6]


def _content(words: list[str]) -> list[str]:
    """Stems of the content words (no stopwords, no numbers)."""
    return [_stem(w) for w in words if w not in _STOP and not w.isdigit() and w not in _NUMBER_WORDS]


def _numbers(text: str, words: list[str]) -> set[str]:
    found = {n.replace(",", "") for n in _NUM.findall(text)}
    found = {n.rstrip("0").rstrip(".") if "." in n else n for n in found}
    return {re.sub(r"^0+(?=\d)", "", n) for n in found} | {
        _NUMBER_WORDS[w] for w in words if w in _NUMBER_WORDS}


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?。！？])\s+|\n+", text) if s.strip()]


def _ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


@dataclass
class _View:
    """Everything the rules look at, computed once per case."""

    text: str
    raw: str
    header: str
    answer: str
    words: list[str]
    first: str
    user: list[str]  # content stems of the user turn
    query: set[str]
    answer_only: set[str]  # content stems in the answer but not the query
    numbers: set[str]
    query_numbers: set[str]
    answer_numbers: set[str]
    query_words: list[str]
    answer_words: list[str]
    query_text: str

    @property
    def opens_user(self) -> bool:
        """Does the first sentence read as the user (a question, a user cue, or the query itself)?"""
        first = _content(_words(self.first))
        query_like = len(first) >= 3 and sum(s in self.query for s in first) >= 0.7 * len(first)
        return "?" in self.first or bool(_USER_CUE.search(self.first)) or query_like

    @property
    def answer_asks(self) -> bool:
        return "?" in self.answer.strip()[-300:]

    @property
    def answer_truncated(self) -> bool:
        end = self.answer.rstrip()[-1:]
        return bool(end) and (end.isalpha() or end in ",:;-+=(/")


def _view(case: Case) -> _View:
    raw = case.raw_user_turn or case.user_turn
    text = _strip_special(case.user_turn if case.user_turn.strip() else raw)
    q_words, a_words, words = _words(case.query), _words(case.answer), _words(text)
    query, answer = set(_content(q_words)), set(_content(a_words))
    sentences = _sentences(text)
    return _View(text, raw, case.assistant_header.strip(), case.answer, words,
                 sentences[0][:400] if sentences else "", _content(words), query, answer - query,
                 _numbers(text, words), _numbers(case.query, q_words),
                 _numbers(case.answer, a_words), q_words, a_words, case.query)


# ---- 1. an assistant role header: explicit evidence of speaking as the assistant ----------------
def _rule_header(v: _View) -> Verdict | None:
    raw = unicodedata.normalize("NFKC", v.raw)
    for header in [h for h in (v.header, *_HEADERS) if h]:
        at = raw.find(unicodedata.normalize("NFKC", header))
        if at < 0:
            continue
        before, after = _strip_special(raw[:at]), _strip_special(raw[at + len(header):])
        # A header at the very end is how the turn was stopped (the pipeline's stop list holds the
        # header; for deepseek, glm4 and [INST] templates it is the normal end): no evidence alone.
        if after and len(after) >= len(before):
            return "assistant_drift", "the turn opens an assistant role header and speaks after it"
    if _ROLE_ASSISTANT.match(v.text):
        return "assistant_drift", "the turn starts with an assistant role marker"
    return None


# ---- 2. empty: nothing, markup, punctuation, a stray fragment, or degenerate repetition ---------
def _degenerate(text: str, words: list[str]) -> bool:
    compact = re.sub(r"\s+", "", text)[:4000]
    if len(compact) >= 6 and re.fullmatch(r"(.{1,30}?)\1{3,}.{0,30}", compact, re.S):
        return True
    if (len(words) >= 4 and len(set(words)) == 1) or (
            len(words) >= 12 and len(_ngrams(words, 3)) < 0.4 * (len(words) - 2)):
        return True
    lines = Counter(line.strip() for line in text.splitlines() if line.strip())
    if sum(lines.values()) >= 4 and lines.most_common(1)[0][1] * 2 >= sum(lines.values()) >= 6:
        return True
    data = text.encode()
    return len(data) >= 300 and len(data) / len(zlib.compress(data, 9)) >= 3.5


def _rule_empty(v: _View) -> Verdict | None:
    text = v.text.strip()
    if not text:
        return "empty", "nothing visible after removing whitespace and special tokens"
    if not any(c.isalnum() for c in text):
        if any(unicodedata.category(c) == "So" for c in text):
            return None, "undecided: only emoji or symbols, which may be an acknowledgement"
        return "empty", "only punctuation or symbols"
    core = text.lower().strip(" .!?,;:'\"")
    if sum(c.isalnum() for c in text) <= 2 and core not in _SHORT_OK and not _CJK.search(
            text) and not (core.isdigit() and v.answer_asks):
        return "empty", "a stray fragment of one or two characters"
    if _degenerate(text, v.words):
        first = _words(v.first)
        if (len(first) >= 4 and len(set(first)) >= 0.8 * len(first) and text.count(v.first) == 1
                and ("?" in v.first or _NEW_START.match(v.first))):
            return None, "undecided: a coherent question or request that degenerates later"
        return "empty", "degenerate repetition (looping tokens, words, lines or phrases)"
    return None


# ---- 3. the opening voice: an assistant opening, or talk about the user from outside -------------
def _rule_opening(v: _View) -> Verdict | None:
    if _DRIFT_OPEN.match(v.text):
        return "assistant_drift", "opens like an assistant reply (offer, solution or closing phrase)"
    if _META.search(v.first):
        return "meta", "opens by talking about the user, the assistant or the conversation"
    return None


# ---- 4. the body: meta narration, or assistant-side text that dominates -------------------------
def _assistant_sentence(sentence: str) -> int:
    """2: clearly assistant-side; 1: weakly (a connective or "The answer is" with a number); 0: not."""
    if _DRIFT_ANY.search(sentence):
        return 2
    if "?" in sentence or _USER_CUE.search(sentence):
        return 0
    if _DRIFT_OPEN.match(sentence) or _ANSWER_MARK.search(sentence) or _EQUATION.search(sentence):
        return 2
    return int(bool(_CONNECTIVE.match(sentence) and re.search(r"\d", sentence)))


def _copied(words: list[str], v: _View) -> float:
    """Share of these words' 4-grams that come from the answer but not from the query."""
    grams = _ngrams(words, 4)
    copied = _ngrams(v.answer_words, 4) - _ngrams(v.query_words, 4)
    return len(grams & copied) / len(grams) if grams else 0.0


def _rule_body(v: _View) -> Verdict | None:
    if _META.search(v.text) and not v.opens_user:
        return "meta", "talks about the user, the assistant or the conversation from outside"
    kinds = [(_assistant_sentence(s), len(_words(s))) for s in _sentences(v.text)]
    side = sum(n for kind, n in kinds if kind) if any(k == 2 for k, _ in kinds) else 0
    share = side / max(1, len(v.words))
    if side and (share > 0.5 or (not v.opens_user and share >= 0.3)):
        return "assistant_drift", "mostly assistant-side text (solving, answer marks or closings)"
    if side:
        return None, "undecided: user-side text mixed with some assistant-style text"
    if len(v.words) >= 12 and _copied(v.words, v) >= 0.5:
        if v.opens_user and _copied(_words(v.first), v) < 0.5:
            return None, "undecided: quotes much of the answer inside a user-voiced turn"
        return "assistant_drift", "a coherent copy of a large part of the assistant's answer"
    return None


# ---- 5. a role label ("User: ...") makes the turn a script: leave it to the judge ---------------
def _rule_role_label(v: _View) -> Verdict | None:
    if _ROLE_LABEL.match(v.text):
        return None, "undecided: the turn is prefixed with a role or script label"
    return None


# ---- 6. restatement: mostly the query's words, nothing taken from the answer --------------------
def _rule_restatement(v: _View) -> Verdict | None:
    taken = sum(s in v.answer_only for s in v.user)
    if v.numbers & v.answer_numbers - v.query_numbers or taken > max(1, 0.1 * len(v.user)):
        return None  # takes a result or content from the answer: it reacts to the answer
    if len(v.user) < 3 or not v.query:
        return None
    coverage = len(set(v.user) & v.query) / len(v.query)
    purity = sum(s in v.query for s in v.user) / len(v.user)
    if coverage >= 0.6 and purity >= 0.8:
        return "restatement", f"repeats {coverage:.0%} of the query's content words and adds little"
    return None


# ---- 7. generic: only gratitude / acknowledgement words, nothing grounded -----------------------
def _rule_generic(v: _View) -> Verdict | None:
    if not v.words or len(v.words) > 15 or any(w not in _GENERIC for w in v.words):
        return None
    if v.answer_asks and _REPLY_WORDS & set(v.words):
        return None, "undecided: a short reply that may answer the assistant's question"
    return "generic", "only gratitude or acknowledgement, not grounded in the answer"


# ---- 8. follow_up: a user question/dispute grounded in the answer, or asking for a cut-off rest --
def _rule_follow_up(v: _View) -> Verdict | None:
    if len(v.words) > 60 or len(_sentences(v.text)) > 4:
        return None
    if v.answer_truncated and _CUTOFF.search(v.text) and len(v.words) <= 25:
        return "follow_up", "asks for the missing part of an answer that was cut off"
    replying = v.answer_asks and v.words[0] in _REPLY_WORDS
    if not _REQUEST.search(v.text) or not (replying or _REF_CUE.search(v.text)):
        return None
    new_numbers = v.numbers - v.query_numbers - v.answer_numbers
    if len(new_numbers) >= 2 and not _DISPUTE.search(v.text):
        return None
    numbers = v.numbers & (v.answer_numbers - v.query_numbers)
    words = {s for s in v.user if s in v.answer_only and len(s) >= 4 and s not in _NOT_ARTIFACT}
    if numbers:
        return "follow_up", f"questions the answer's number(s) {', '.join(sorted(numbers))}"
    if len(words) >= 2 or (words and (replying or _STRONG_REF.search(v.text))):
        return "follow_up", f"questions the answer's specific content ({', '.join(sorted(words))})"
    return None


# ---- 9. new_query: a question or request sharing no content with the query or the answer -------
def _rule_new_query(v: _View) -> Verdict | None:
    opening = " ".join(v.text.split()[:8])
    if v.answer_asks or _DEICTIC.search(opening) or _REACTS.search(v.text) or len(v.words) > 150:
        return None
    if not ("?" in v.text or _NEW_START.match(v.text)):
        return None
    english = sum(w in _STOP for w in v.words) / max(1, len(v.words))
    query_english = sum(w in _STOP for w in v.query_words) / max(1, len(v.query_words))
    if query_english >= 0.2 and english < 0.1:
        return None  # another language: shared words cannot be judged
    user = set(v.user)
    common = len(user & (v.query | v.answer_only))
    shared = common / max(1, len(user))
    fresh = v.numbers - v.query_numbers - v.answer_numbers
    unrelated = common == 0 or (common == 1 and len(user) >= 5)  # one word: a homonym, at most
    if (len(user) >= 2 or len(fresh) >= 2) and unrelated and fresh == v.numbers:
        return "new_query", "a question or request sharing no content words with query or answer"
    if len(fresh) >= 2 and fresh == v.numbers and len(user) >= 5 and shared <= 0.34 and len(
            v.words) >= 12:
        return "new_query", "a new word problem with its own numbers and little shared content"
    return None


# The order: the header is explicit evidence whatever the text; empty turns cannot be anything
# else; then the VOICE of the turn (assistant, outside narrator) decides before its content, since
# a re-solved problem or a narration also shares words with the query and answer; a role-labelled
# script is left alone; then content: restatement (query words) before generic (no content) before
# follow_up (answer content) before new_query (no shared content), the last being the least certain.
_RULES: tuple[Callable[[_View], "Verdict | None"], ...] = (
    _rule_header, _rule_empty, _rule_opening, _rule_body, _rule_role_label,
    _rule_restatement, _rule_generic, _rule_follow_up, _rule_new_query,
)


class RulesClassifier:
    """Labels the clear cases of labels.md; leaves the rest undecided for the judge."""

    name = "rules"
    version = "1"  # bump when rules change; stored beside labels

    def classify(self, case: Case) -> Label:
        try:
            view = _view(case)
            for rule in _RULES:
                verdict = rule(view)
                if verdict is not None:
                    return Label(label=verdict[0], source=self.name, rationale=verdict[1])  # type: ignore[arg-type]
        except Exception as exc:  # a classifier must never break the pipeline
            return Label(label=None, source=self.name, rationale="undecided: rules failed",
                         error=f"{type(exc).__name__}: {exc}")
        return Label(label=None, source=self.name, rationale="undecided: no rule fired")
