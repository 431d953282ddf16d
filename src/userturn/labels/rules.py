"""A deterministic, offline, rule-based classifier of generated user turns.

The rules follow docs/labels.md. They label only the CLEAR cases and return an undecided
``Label`` (``label=None``) for everything else, so that an LLM judge labels those later: a wrong
confident label costs more than an undecided one. Deliberately left undecided: word salad and
fluent gibberish (labels.md calls it ``empty``, but rules cannot tell it from prose), emoji-only
replies, a user opening mixed with an assistant-style continuation that does not dominate,
role-labelled scripts ("User: ..."), short replies that may answer a question the assistant asked,
"what if" variations and partial paraphrases of the query, a task on the query's topic that is
not one question mostly of its own words, questions that share too little with the answer to be
called grounded, requests to continue an answer that does not look cut off, a bare number, "The
answer is N." with an N other than the assistant's final answer (with that N it restates the
answer: drift; "is not N" disputes it), and a question that degenerates into repetition later. The
pipeline splits a reasoning model's thinking off first (``Case.thinking``): the rules label the
visible text, and a turn that is thinking only is ``empty``. A thinking block left in the text
counts as text: reasoning about how to respond reads as ``meta``. A query's format
instructions ("Give the result as your final answer.") are no task content, and "What is the
answer to the question: X" is read as X.

The assistant role header counts only when the model speaks after it: the pipeline stops on that
header, and for deepseek, glm4 and [INST] templates it is the normal end of a user turn.
Rules run in a fixed order and the first that fires wins (see ``_RULES``). Standard library only.
"""

from __future__ import annotations

import math
import re
import unicodedata
import zlib
from collections import Counter
from typing import Callable, Iterable, Optional, Tuple

from userturn.records import Case, Label

Verdict = Tuple[Optional[str], str]  # (label, or None for undecided; which rule fired)

# ---- lexicon ------------------------------------------------------------------------------------
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
_NUMBER_WORDS.update(thirty="30", forty="40", fifty="50", hundred="100", dozen="12")
_STOP = set("""a an the and or but if then so of to in on at by for with from about as into than
too very is are was were be been being am do does did done have has had having i me my mine we us
our you your yours he him his she her it its they them their this that these those there here what
which who whom whose when where why how many much more most some any all each every no not nor
only own same other such can could will would shall should may might must just also now up down
out over under again once s t don't i'm it's that's let's what's there's get got go without within
onto upon via per de la el los las que y en un una es por para con se le les des et est une du
der die das und ist ein eine zu mit il lo di che non""".split())
_GENERIC = set("""thanks thank thx ty you so much a lot for the your help helping helpful great ok
okay k alright got it i see cool nice awesome perfect good very really that this makes make sense
was is clear clearer understand understood now wow amazing excellent appreciate appreciated sure
yes yeah yep fine noted oh ah hmm can could would explain more elaborate further please tell me
about detail details brilliant fantastic wonderful lovely sounds glad to know learned something
new interesting super answer response explanation information info all right that's it's again
helps helped explaining job work get bunch ton patience clearly simply simpler differently
gracias muchas merci beaucoup danke vielen dank grazie obrigado спасибо 谢 好 ありがとう 감사합니다
""".split())
_SHORT_OK = {"ok", "k", "no", "hi", "oh", "ty", "ya"}
_REPLY_WORDS = {"yes", "yeah", "yep", "sure", "please", "no", "ok", "okay", "alright", "fine"}
_ANSWER_TALK = set("""answer step solution result total explain question help thanks calculation
problem first second third final number example correct wrong right mean understand sure more
again part""".split())  # words ABOUT an answer, not from it: they ground nothing
_MAX_CHARS = 20000
_HEADERS = ("<|im_start|>assistant", "<|start_header_id|>assistant<|end_header_id|>",
            "<|assistant|>", "<start_of_turn>model", "<|start|>assistant")


# ---- patterns (one alternative per line where they are long) -------------------------------------
def _rx(*alternatives: str, flags: int = re.I) -> re.Pattern[str]:
    return re.compile("|".join(alternatives), flags)


_R = r"(?:user|assistant|system|model|tool|developer|human)"
_SPECIAL = _rx(
    rf"<\|im_start\|>{_R}?", rf"<\|start_header_id\|>{_R}?<\|end_header_id\|>",
    rf"<start_of_turn>{_R}?", rf"<\|start\|>{_R}?", r"<\|[^<>|\n]{1,40}\|>", r"</?s>", r"</?think>",
    r"\[/?INST\]", r"<</?SYS>>", r"<(?:bos|eos|pad|unk|end_of_turn|mask)>")
_HAN = re.compile(r"([\u3400-\u9fff])")  # one token per Han character
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
_NUM = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_ROLE_ASSISTANT = _rx(r"^\W{0,4}(?:assistant|ai|chatbot|bot|gpt)\s*(?::|\n)")
_ROLE_LABEL = _rx(r"^\W{0,4}(?:user|human|me|customer|student|question|q|follow-?up(?: question)?)"
                  r"\s*:")
_DRIFT_OPEN = _rx(  # anchored at the start of the turn (or of a sentence)
    r"^\W{0,4}(?:sure|certainly|of course|absolutely|okay|great)[!,.]?\s+(?:here(?:'s| is| are)|"
    r"i(?:'d| would) be (?:happy|glad)|i can|let'?s|let me|i'll)",
    r"^\W{0,4}(?:let'?s|let us) (?:solve|break|calculate|compute|work|think|figure|go through|"
    r"start|find|determine|analy[sz]e|tackle|begin|approach)",
    r"^\W{0,4}to (?:solve|find|determine|calculate|compute|figure out|answer|work out)\b",
    r"^\W{0,4}step 1\b",
    r"^\W{0,4}here(?:'s| is| are) (?:the|a) (?:step-by-step |detailed |complete |full |corrected )?"
    r"(?:solution|answer|explanation|breakdown|calculation|steps)",
    r"^\W{0,4}(?:(?:great|good) question|you(?:'re| are) (?:very )?welcome|glad (?:i could|to) help"
    r"|as an ai\b|i apologi[sz]e for (?:the|any|my))")
_DRIFT_ANY = _rx(
    r"i hope (?:this|that) helps", r"let me know if you (?:have|need|want|'d like|would like)",
    r"feel free to (?:ask|reach out|let me know)", r"is there anything else (?:i can|you)",
    r"happy to help")
_ANSWER_MARK = _rx(r"####\s*\$?-?\d", r"\\boxed\{", r"\bthe final answer is", r"^answer\s*:",
                   r"\b(?:so|therefore|thus|hence),? the (?:final )?answer is")
_EQUATION = re.compile(  # bounded repeats keep it linear on long runs of numbers
    r"(?<![\d,.])\d[\d,.]{0,12}(?:\s*[-+*/×÷x]\s*\$?\d[\d,.]{0,12}){1,6}\s*=\s*\$?-?\d")
_CONNECTIVE = _rx(r"^\W{0,4}(?:so|therefore|thus|hence|first|next|then|finally|now|step \d|"
                  r"the (?:final )?answer is)\b")
_META = _rx(
    r"(?:^|[.!?:]\s+|\n)\W{0,4}(?:(?:so|okay|ok|well|hmm|alright),?\s+){0,2}the user(?:'s)? "
    r"(?:is asking|is requesting|is looking|is trying|is interested|is curious|wants|wanted|asks|"
    r"asked|has asked|seems|needs|would like|might|may|would|could|likely|query|question|request|"
    r"response|has provided|provided|has given|gave|has shared)\b",
    r"\bin this conversation\b",
    r"\bthe assistant(?:'s)? (?:answer|response|solution|has|is|provided|gave|explained|answered|"
    r"correctly|incorrectly|should|did)\b",
    r"^\W{0,4}the assistant\b",
    r"here(?:'s| is) (?:a|an|one) (?:possible|potential|sample|example|likely|realistic|natural|"
    r"plausible) (?:user |follow-up |follow up )?"
    r"(?:response|reply|question|follow-up|message|turn)",
    r"here(?:'s| is) (?:a|the) user(?:'s)? (?:response|reply|question|follow-up|message|turn)",
    r"as (?:the|a) user,? i\b",
    r"^\W{0,4}(?:possible |sample |next )?user (?:response|reply|turn|message)\s*:",
    r"^\W{0,4}possible follow-?up(?: question)?\s*:",
    r"^\W{0,4}you are (?:a|an) (?:helpful|friendly|expert|knowledgeable|ai|large language|smart|"
    r"honest|harmless)",
    r"^\W{0,4}you are (?:a|an|the) (?:[\w-]+ ){0,3}(?:expert|specialist|assistant|tutor|teacher|"
    r"consultant|advisor|chatbot) (?:in|at|on|for|who|that|with)\b[^?!]*$",  # a role prompt
    r"^\W{0,4}(?:###\s*)?(?:system|instructions?)\s*:",
    r"\b(?:i|we) (?:need|should|have|want) to (?:respond|reply|write|generate|come up with|craft) "
    r"(?:a|an|the|as)\b",
    r"\bhow (?:should|do|would) i respond\b")
_USER_CUE = _rx(r"\b(?:you|your|you're|thanks|thank|i think|i thought|i believe|i got|i get|"
                r"i don't|i'm not sure|i'm confused|wait|hmm|why|how come|great job|good job|"
                r"well done|correct|you got it)\b")
_ASKS = _rx(r"\?", r"\b(?:can|could|would|will) you\b", r"\bplease\b")
_QUESTION_OPEN = (r"^\W{0,4}(?:what|which|who|whose|where|when|why|how|does|do|did|is|are|was|"
                  r"were)\b")  # a question without its question mark
_REQUEST = _rx(
    r"\?", _QUESTION_OPEN,
    r"\b(?:why|how|can you|could you|would you|please|i think|should be|shouldn't|wrong|mistake|"
    r"incorrect|not right|don't understand|you said|you wrote|you forgot|you missed|what if|"
    r"show me|explain)\b",
    r"^\W{0,4}(?:show|explain|tell|give|write|redo|try|use|add|convert|rewrite|list|make|change|"
    r"fix|do)\b")
_WHY = r"\b(?:por qué|pourquoi|warum|perché)\b|为什么"
_STRONG_REF = _rx(r"\b(?:why|how come|how did|how do you|where did|where does|where do|did you|"
                  r"you (?:said|wrote|mentioned|used|got|did)|your|wait|instead|wrong|mistake|"
                  r"incorrect|not right|mean|shouldn't|should be|i think|i believe|i got)\b", _WHY)
_REF_CUE = _rx(r"\b(?:you|that|this|those|these|it|step|explain|clarify|error)\b", _WHY)
_CUTOFF = _rx(r"\b(?:stopped|cut off|got cut|cut short|mid-?sentence|incomplete|unfinished|"
              r"didn't finish|not finished|continue|finish|keep going|go on|rest of|"
              r"complete (?:it|the)|what's next|next step)\b")
_NEW_ASK = _rx(r"^\W{0,4}(?:what|how|who|where|when|which|why|can|could|would|is|are|do|does|write|"
               r"tell|give|list|describe|explain|translate|create|generate|compose|name|suggest|"
               r"recommend|calculate|solve|find|rewrite|if|a|an)\b")
_NEW_STORY = re.compile(  # "Tom has 7 marbles..."
    r"^\W{0,4}[A-Z][a-z]+ (?:has|had|is|was|buys|bought|wants|earns|reads|runs)\b")
_DEICTIC = _rx(r"\b(?:this|(?:(?<=is )|(?<=was )|(?<=n't ))that|these|those|it|them|same|instead|"
               r"that(?! (?:a|an|the|every|each|she|he|they|there|his|her)\b)|"  # "so that every"
               r"again|above|previous|your|you said|what about|what if|how about)\b")  # 8 words
_REACTS = _rx(r"\b(?:(?:the|your|this|that|my|an?)(?: \w+)? answers?|"  # not "Answer his..."
              r"steps?|solution|result|explain|explanation|calculation|example|"
              r"did you|you (?:made|got|did|said|wrote|used|forgot|missed|mean)|mistake|wrong|"
              r"incorrect|i got|i think|should be|correct|right|again|instead|also|else)\b")
_VARIES = _rx(r"^\W{0,4}how (?:much|many|long|far|often|old)\b",
              r"\b(?:if|suppose|supposing|assum\w*|instead|rather|would|could)\b")
_MEANS = _rx(r"^\W{0,4}(?:so,? )?(?:does|doesn't|did) (?:that|this) mean\b",
             r"^\W{0,4}so (?:that|this) means\b")
_STATES_ANSWER = _rx(r"^\W{0,4}the (?:final )?answer is(?P<neg>\s+not|n't)?:?\s*\$?"
                     r"(?P<n>-?\d[\d,]*(?:\.\d+)?)(?: [^\W\d_]+)?[^\w?]*$")  # "9 pebbles."
_RESULT = _rx(r"(?:=|answer is:?|####|\\boxed\{)\s*\$?(-?\d[\d,]*(?:\.\d+)?)")  # results
_FORMAT = _rx(  # a format instruction in the query ("Give the result as your final answer.")
    r"^\W{0,4}(?:please,? )?(?:give|do not|don't|put|write|express|round|provide|present|state|"
    r"return|show|enclose|include|answer)\b.{0,80}\b(?:answer|result|units?|decimal|boxed)\b")
_WRAPPER = _rx(r"^\W{0,4}what(?: is|'s) the (?:answer|solution) to (?:the|this|the following)"
               r"(?: [\w-]+){0,4}? (?:question|problem|puzzle|riddle)\s*[:-]\s*")  # frames the rest


# ---- text helpers -------------------------------------------------------------------------------
def _strip_special(text: str) -> str:
    return _SPECIAL.sub(" ", unicodedata.normalize("NFKC", text).replace("’", "'")).strip()


def _words(text: str) -> list[str]:
    return _WORD.findall(_HAN.sub(r" \1 ", text.lower()))


def _stem(word: str) -> str:
    for suffix in ("'s", "ing", "ed", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 2:
            word = word[: -len(suffix)]
            break
    return (word[:-1] if len(word) >= 3 and word.endswith("e") else word)[:6]


class _Pool:
    """Stems; one of 5+ letters also matches a longer or shorter one (japan ~ japanese)."""

    def __init__(self, stems: Iterable[str]) -> None:
        self.stems = set(stems)
        self._by_prefix: dict[str, list[str]] = {}
        for stem in self.stems:
            self._by_prefix.setdefault(stem[:5], []).append(stem)

    def __contains__(self, stem: object) -> bool:
        if stem in self.stems:
            return True
        return isinstance(stem, str) and len(stem) >= 5 and any(
            s.startswith(stem) or stem.startswith(s) for s in self._by_prefix.get(stem[:5], ()))


def _content(words: list[str]) -> list[str]:
    """Stems of the content words (no stopwords, no numbers)."""
    return [_stem(w) for w in words
            if w not in _STOP and not w.isdigit() and w not in _NUMBER_WORDS]


def _numbers(text: str, spelled: Iterable[str] = ()) -> set[str]:
    """Numbers written with digits, canonical ("1,000.50" -> "1000.5"), plus spelled-out ones."""
    found = {n.replace(",", "") for n in _NUM.findall(text)}
    found = {n.rstrip("0").rstrip(".") if "." in n else n for n in found}
    return {re.sub(r"^0+(?=\d)", "", n) for n in found} | {
        _NUMBER_WORDS[w] for w in spelled if w in _NUMBER_WORDS}


def _sentences(text: str) -> list[str]:
    ends = r"(?<!\bM[rs]\.)(?<!\bMrs\.)(?<!\bDr\.)(?<!\bvs\.)(?<=[.!?。！？])\s+"  # not "Ms. X"
    return [s for s in re.split(ends + r"|\n+", text) if s.strip()]


def _ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


class _View:
    """Everything the rules look at, computed once per case."""

    def __init__(self, case: Case) -> None:
        self.case = case
        text = _strip_special(case.user_turn if case.user_turn.strip() else case.raw_user_turn)
        text = text[:_MAX_CHARS]  # a longer turn is judged by its beginning: bounds the work
        unwrapped = _WRAPPER.sub("", text, count=1)  # "What is the answer to this puzzle: X" is X
        self.wrapped = unwrapped not in ("", text)
        self.text = unwrapped if self.wrapped else text
        # the task: the query without its format instructions, whose words no turn reacts to
        task = " ".join(s for s in _sentences(case.query) if not _FORMAT.match(s)) or case.query
        self.task, self.words, self.query_words = task, _words(self.text), _words(task)
        self.answer_words = _words(case.answer)
        sentences = _sentences(self.text)
        self.first = sentences[0][:400] if sentences else ""  # the first sentence
        self.user = _content(self.words)  # content stems of the user turn
        self.query = _Pool(_content(self.query_words))
        self.answer_only = _Pool(s for s in _content(self.answer_words) if s not in self.query)
        self.numbers = _numbers(self.text)  # digits only: a user's "one" is mostly a pronoun
        self.query_numbers = _numbers(task, self.query_words)
        self.answer_numbers = _numbers(case.answer, self.answer_words)
        results = _RESULT.findall(case.answer)  # the last "= N", "answer is N" or "#### N"
        self.final = next(iter(_numbers(results[-1])), None) if results else None
        answer = case.answer.rstrip()
        self.answer_asks = "?" in answer[-300:]
        self.answer_truncated = answer[-1:].isalpha() or (answer != "" and answer[-1] in ",:;-+=(/")

    @property
    def opens_user(self) -> bool:
        """Does the first sentence read as the user (a question, a user cue, or the query)?"""
        first = _content(_words(self.first))
        query_like = len(first) >= 3 and sum(s in self.query for s in first) >= 0.7 * len(first)
        return "?" in self.first or bool(_USER_CUE.search(self.first)) or query_like


# ---- 1. an assistant role header followed by speech: the model took the assistant's turn -------
def _rule_header(v: _View) -> Verdict | None:
    raw = unicodedata.normalize("NFKC", v.case.raw_user_turn or v.case.user_turn)
    for header in [h.strip() for h in (v.case.assistant_header, *_HEADERS) if h.strip()]:
        at = raw.find(unicodedata.normalize("NFKC", header))
        if at < 0:
            continue
        before, after = _strip_special(raw[:at]), _strip_special(raw[at + len(header):])
        if after and len(after) >= len(before):  # a header at the very end only stopped the turn
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
    for units, least in ((text.splitlines(), 3), (_sentences(text[:4000]), 4)):
        counts = Counter(unit.strip() for unit in units if unit.strip())
        top = counts.most_common(1)[0][1] if counts else 0
        if top >= least and top * 2 >= sum(counts.values()):  # one line or sentence, looping
            return True
    data = text.encode()
    return len(data) >= 300 and len(data) / len(zlib.compress(data, 9)) >= 3.5


def _rule_empty(v: _View) -> Verdict | None:
    text = v.text
    if not text:
        return "empty", "nothing visible after removing whitespace and special tokens"
    if not any(c.isalnum() for c in text):
        if any(unicodedata.category(c) == "So" for c in text):
            return None, "undecided: only emoji or symbols, which may be an acknowledgement"
        return "empty", "only punctuation or symbols"
    core = text.lower().strip(" .!?,;:'\"")
    if sum(c.isalnum() for c in text) <= 2 and core not in _SHORT_OK and not _HAN.search(text) \
            and not core.isdigit():  # "72" may echo or answer something: not a stray fragment
        return "empty", "a stray fragment of one or two characters"
    if _degenerate(text, v.words) and not v.wrapped:  # "The answer to this problem: 1 + 1 + 1"
        first = _words(v.first)
        if len(first) >= 3 and len(set(first)) >= 0.8 * len(first) and text.count(v.first) == 1 \
                and (_REQUEST.search(v.first) or _NEW_ASK.match(v.first)):  # not a story
            return None, "undecided: a coherent question or request that degenerates later"
        return "empty", "degenerate repetition (looping tokens, words, lines or phrases)"
    return None


# ---- 3. the opening voice: an assistant opening, talk about the user from outside, a script -----
def _rule_opening(v: _View) -> Verdict | None:
    if _DRIFT_OPEN.match(v.text) and not _ASKS.search(v.first):
        return "assistant_drift", "opens like an assistant reply (offer, solution or closing)"
    if _META.search(v.first):
        return "meta", "opens by talking about the user, the assistant or the conversation"
    if _ROLE_LABEL.match(v.text):  # "User: ..." makes the turn a script: leave it to the judge
        return None, "undecided: the turn is prefixed with a role or script label"
    return None


# ---- 4. the body: meta narration, or assistant-side text that dominates -------------------------
def _assistant_sentence(sentence: str) -> int:
    """2: clearly assistant-side; 1: weakly (a connective or "The answer is" + number); 0: not."""
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
    sentences = _sentences(v.text)
    kinds = [(_assistant_sentence(s), len(_words(s))) for s in sentences]
    side = sum(n for kind, n in kinds if kind) if any(k == 2 for k, _ in kinds) else 0
    share = side / max(1, len(v.words))
    # a text ending in a question poses a problem rather than solving one
    ends_asking = "?" in sentences[-1] and not _DRIFT_ANY.search(v.text)
    if side and not ends_asking and (share > 0.5 or (not v.opens_user and share >= 0.3)):
        return "assistant_drift", "mostly assistant-side text (solving, answer marks or closings)"
    if side:
        return None, "undecided: user-side text mixed with some assistant-style text"
    if len(v.words) >= 12 and _copied(v.words, v) >= 0.5:
        if v.opens_user and _copied(_words(v.first), v) < 0.5:
            return None, "undecided: quotes much of the answer inside a user-voiced turn"
        return "assistant_drift", "a coherent copy of a large part of the assistant's answer"
    return None


# ---- 5. "The answer is N.": the assistant's final answer stated again, or disputed --------------
def _rule_answer_statement(v: _View) -> Verdict | None:
    found = _STATES_ANSWER.match(v.text)
    if not found or v.final is None or _numbers(found["n"]) != {v.final}:
        return None  # another number: a user's own result or the model solving anew
    if found["neg"]:
        return "follow_up", f"disputes the assistant's final answer {v.final}"
    if v.answer_asks:
        return None, "undecided: states the answer after the assistant asked a question"
    return "assistant_drift", f"states the assistant's final answer {v.final} again, as the answer"


# ---- 6. restatement: mostly the query's words, nothing taken from the answer --------------------
def _rule_restatement(v: _View) -> Verdict | None:
    taken = sum(s in v.answer_only for s in v.user)
    if v.numbers & v.answer_numbers - v.query_numbers or taken > max(1, 0.1 * len(v.user)):
        return None  # takes a result or content from the answer: it reacts to the answer
    if len(v.user) < 3 or not v.query.stems:
        return None
    mine = _Pool(v.user)
    coverage = sum(s in mine for s in v.query.stems) / len(v.query.stems)
    purity = sum(s in v.query for s in v.user) / len(v.user)
    if coverage >= 0.6 and purity >= 0.8:
        return "restatement", f"repeats {coverage:.0%} of the query's content words and adds little"
    question = set(_content(_words(_question(v.task))))  # asks the query's question again?
    one_question = len(_sentences(v.text)) == 1 and re.match(_QUESTION_OPEN, v.text, re.I)
    adds = [s for s in v.user if s not in v.query and s not in v.answer_only]  # "in a leap year"
    if one_question and len(question) >= 3 and purity >= 0.8 and not adds:
        coverage = sum(s in mine for s in question) / len(question)
        if coverage >= 0.75:
            return "restatement", f"asks the query's question again ({coverage:.0%} of its words)"
    return None


def _question(task: str) -> str:
    """The task's last question, from its question word on ("..., how many ... ?")."""
    asked = [s for s in _sentences(task) if "?" in s]
    return re.split(r",\s*(?=(?:how|what|which|who|when|where)\b)", asked[-1], flags=re.I)[-1] \
        if asked else ""


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
    replying = v.answer_asks and v.words[:1] != [] and v.words[0] in _REPLY_WORDS
    strong = replying or bool(_STRONG_REF.search(v.text))
    if not _REQUEST.search(v.text) or not (strong or _REF_CUE.search(v.text)):
        return None
    if _MEANS.match(v.text) and (v.numbers & v.answer_numbers
                                 or set(v.user) & set(_content(v.answer_words))):
        return "follow_up", "asks what the answer means for a number or thing in it"
    if len(v.numbers - v.query_numbers - v.answer_numbers) >= 2 and not strong:
        return None  # brings several numbers of its own: more like a new problem
    numbers = v.numbers & (v.answer_numbers - v.query_numbers)
    strong = strong or any(re.search(rf"\b(?:this|that|your) \$?{re.escape(n)}\b", v.text, re.I)
                           for n in numbers)  # "What does this 180 represent"
    words = sorted({s for s in v.user if s in v.answer_only and len(s) >= 4}
                   - {_stem(w) for w in _ANSWER_TALK})
    if numbers and (strong or len(v.words) <= 5):
        return "follow_up", f"questions the answer's number(s) {', '.join(sorted(numbers))}"
    if len(words) >= 2 or (words and strong):
        return "follow_up", f"questions the answer's specific content ({', '.join(words)})"
    return None


# ---- 9. new_query: a question or request sharing no content with the query or the answer -------
def _rule_new_query(v: _View) -> Verdict | None:
    opening = " ".join(v.text.split()[:8])
    if v.answer_asks or _DEICTIC.search(opening) or _REACTS.search(v.text) or len(v.words) > 150:
        return None
    if not ("?" in v.text or _NEW_ASK.match(v.text) or _NEW_STORY.match(v.text)):
        return None
    if _other_language(v):
        return None  # shared words cannot be compared
    user = set(v.user)
    common = sum(s in v.query or s in v.answer_only for s in user)
    fresh = v.numbers - v.query_numbers - v.answer_numbers
    shared = {n for n in v.numbers - fresh if len(n) > 1}  # a shared digit 1-9 tells nothing
    unrelated = common == 0 or (common == 1 and len(user) >= 5)  # one word: a homonym at most
    if len(user) + len(fresh) + v.wrapped >= 2 and unrelated and not shared:
        return "new_query", "a question or request sharing no content words with query or answer"
    asks = "?" in v.text or re.match(_QUESTION_OPEN, v.text, re.I)
    if asks and len(fresh) >= 2 and len(shared) <= 1 and len(user) >= 4 and len(v.words) >= 12 \
            and common <= max(1, 0.15 * len(user)):
        return "new_query", "a new word problem with its own numbers and little shared content"
    if asks and _new_on_topic(v, user):
        return "new_query", "a new question on the query's topic that takes nothing from the answer"
    return None


def _other_language(v: _View) -> bool:
    words = [w for w in v.words if not w.isdigit()]  # "100 + 100 = ?" has no language
    stop_share = sum(w in _STOP for w in words) / max(1, len(words))
    query_stop_share = sum(w in _STOP for w in v.query_words) / max(1, len(v.query_words))
    return bool(words) and stop_share < 0.1 and query_stop_share >= 0.2


def _new_on_topic(v: _View, user: set[str]) -> bool:
    """One question, mostly about things of its own, nothing from the answer, no "why", and no
    quantity, number or condition that would make it a variation or extension of the problem."""
    own = [s for s in user if s not in v.query and s not in v.answer_only]
    return len(_sentences(v.text)) == 1 and len(own) >= max(3, 0.5 * len(user)) \
        and not any(s in v.answer_only for s in user) and not v.numbers \
        and not _STRONG_REF.search(v.text) and not _VARIES.search(v.text)


def signals_of(case: Case) -> tuple[float, ...]:
    """The measurements the rules decide by, as numbers, for a learned classifier: lengths,
    overlap of the turn with the answer beyond the query and with the query, copied text,
    question form, voice (assistant openings, meta narration, user cues) and repetition."""
    try:
        v = _View(case)
    except Exception:  # the features of a text the rules cannot read: all zero
        return (0.0,) * _N_SIGNALS
    user, n_words = v.user, len(v.words)
    taken = sum(s in v.answer_only for s in user)
    mine = _Pool(user)
    coverage = sum(s in mine for s in v.query.stems) / len(v.query.stems) if v.query.stems else 0.0
    purity = sum(s in v.query for s in user) / len(user) if user else 0.0
    sentences = _sentences(v.text)
    raw = case.raw_user_turn or case.user_turn
    values = (
        math.log1p(n_words), math.log1p(len(sentences)), float(not v.text),
        taken / len(user) if user else 0.0, float(taken), coverage, purity,
        _copied(v.words, v) if n_words >= 4 else 0.0,
        float(len(v.numbers & (v.answer_numbers - v.query_numbers))),
        float(len(v.numbers - v.query_numbers - v.answer_numbers)),
        float(len(v.numbers & v.query_numbers)),
        float(v.answer_asks), float(v.answer_truncated), float(v.opens_user),
        float("?" in v.text), float("?" in v.first), float(bool(_REQUEST.search(v.text))),
        float(bool(_STRONG_REF.search(v.text))), float(bool(_REF_CUE.search(v.text))),
        float(bool(_CUTOFF.search(v.text))), float(bool(_META.search(v.first))),
        float(bool(_META.search(v.text))), float(bool(_DRIFT_OPEN.match(v.text))),
        float(bool(_DRIFT_ANY.search(v.text))), float(bool(_ANSWER_MARK.search(v.text))),
        float(bool(_EQUATION.search(v.text))), float(bool(_USER_CUE.search(v.text))),
        float(bool(_ROLE_LABEL.match(v.text))), float(bool(_ROLE_ASSISTANT.match(v.text))),
        float(bool(_NEW_ASK.match(v.text))), float(bool(_DEICTIC.search(" ".join(
            v.text.split()[:8])))), float(bool(_REACTS.search(v.text))),
        float(_degenerate(v.text, v.words)) if v.text else 0.0,
        float(all(w in _GENERIC for w in v.words)) if v.words else 0.0,
        float(_other_language(v)), float(any(h in raw for h in _HEADERS)),
        float(bool(_SPECIAL.search(raw))),
        sum(not c.isalnum() and not c.isspace() for c in v.text) / max(1, len(v.text)),
        len(set(v.words)) / n_words if n_words else 0.0,
        float(case.answer.strip() == ""), math.log1p(len(case.answer.split())),
    )
    return values


_N_SIGNALS = 41


# The order, and why:
# 1. header: an assistant role header followed by speech is explicit evidence, whatever the text.
# 2. empty: a turn with no content cannot be anything else, and repetition fools later rules.
# 3-4. voice before content: a re-solved problem or a narration about the user also shares words
#    with the query and the answer, so the assistant / outside-narrator voice is decided first
#    (the opening sentence first, as labels.md says the first sentences decide a mixed text).
# 5. "The answer is N." is judged by N: the assistant's final answer restated or disputed.
# 6-9. content, most certain first: restatement (the query's words) before generic (no content)
#    before follow_up (the answer's content) before new_query (no shared content), the least
#    certain of all because "no shared words" can also mean a paraphrase. Then undecided.
_RULES: tuple[Callable[[_View], Optional[Verdict]], ...] = (
    _rule_header, _rule_empty, _rule_opening, _rule_body, _rule_answer_statement,
    _rule_restatement, _rule_generic, _rule_follow_up, _rule_new_query,
)


def thinking_only(source: str) -> Label:
    """A turn with thinking and nothing visible wrote no user turn: ``empty`` (labels.md)."""
    return Label(label="empty", source=source,
                 rationale="thinking only: no visible text after the thinking")


class RulesClassifier:
    """Labels the clear cases of labels.md; leaves the rest undecided for the judge."""

    name = "rules"
    version = "2"  # bump when rules change; stored beside labels

    def classify(self, case: Case) -> Label:
        if case.thinking.strip() and not case.user_turn.strip():
            return thinking_only(self.name)
        try:
            view = _View(case)
            for rule in _RULES:
                verdict = rule(view)
                if verdict is not None:
                    return Label(label=verdict[0], source=self.name,  # type: ignore[arg-type]
                                 rationale=verdict[1])
        except Exception as exc:  # a classifier must never break the pipeline
            return Label(label=None, source=self.name, rationale="undecided: the rules failed",
                         error=f"{type(exc).__name__}: {exc}")
        return Label(label=None, source=self.name, rationale="undecided: no rule fired")
