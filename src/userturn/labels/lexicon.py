"""How the rules read a text: word lists, the cue patterns, and words, stems, numbers, sentences.

The vocabulary of :mod:`userturn.labels.rules` and of the signals a learned classifier reads
(``signals_of``): each pattern is a cue some rule decides by, written once here so that a rule and
its signal cannot drift apart. Standard library only.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
import zlib
from collections import Counter
from typing import Iterable

# ---- lexicon ------------------------------------------------------------------------------------
NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
NUMBER_WORDS.update(thirty="30", forty="40", fifty="50", hundred="100", dozen="12")
STOPWORDS = set("""a an the and or but if then so of to in on at by for with from about as into than
too very is are was were be been being am do does did done have has had having i me my mine we us
our you your yours he him his she her it its they them their this that these those there here what
which who whom whose when where why how many much more most some any all each every no not nor
only own same other such can could will would shall should may might must just also now up down
out over under again once s t don't i'm it's that's let's what's there's get got go without within
onto upon via per de la el los las que y en un una es por para con se le les des et est une du
der die das und ist ein eine zu mit il lo di che non""".split())
GENERIC_WORDS = set("""thanks thank thx ty you so much a lot for the your help helping helpful great
ok okay k alright got it i see cool nice awesome perfect good very really that this makes make sense
was is clear clearer understand understood now wow amazing excellent appreciate appreciated sure
yes yeah yep fine noted oh ah hmm can could would explain more elaborate further please tell me
about detail details brilliant fantastic wonderful lovely sounds glad to know learned something
new interesting super answer response explanation information info all right that's it's again
helps helped explaining job work get bunch ton patience clearly simply simpler differently
gracias muchas merci beaucoup danke vielen dank grazie obrigado спасибо 谢 好 ありがとう 감사합니다
""".split())
SHORT_OK = {"ok", "k", "no", "hi", "oh", "ty", "ya"}
REPLY_WORDS = {"yes", "yeah", "yep", "sure", "please", "no", "ok", "okay", "alright", "fine"}
ANSWER_TALK = set("""answer step solution result total explain question help thanks calculation
problem first second third final number example correct wrong right mean understand sure more
again part""".split())  # words ABOUT an answer, not from it: they ground nothing
ASSISTANT_HEADERS = ("<|im_start|>assistant", "<|start_header_id|>assistant<|end_header_id|>",
                     "<|assistant|>", "<start_of_turn>model", "<|start|>assistant")


# ---- patterns (one alternative per line where they are long) -------------------------------------
def _rx(*alternatives: str, flags: int = re.I) -> re.Pattern[str]:
    return re.compile("|".join(alternatives), flags)


_R = r"(?:user|assistant|system|model|tool|developer|human)"
SPECIAL_TOKENS = _rx(
    rf"<\|im_start\|>{_R}?", rf"<\|start_header_id\|>{_R}?<\|end_header_id\|>",
    rf"<start_of_turn>{_R}?", rf"<\|start\|>{_R}?", r"<\|[^<>|\n]{1,40}\|>", r"</?s>", r"</?think>",
    r"\[/?INST\]", r"<</?SYS>>", r"<(?:bos|eos|pad|unk|end_of_turn|mask)>")
HAN = re.compile(r"([\u3400-\u9fff])")  # one token per Han character
WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
ROLE_ASSISTANT = _rx(r"^\W{0,4}(?:assistant|ai|chatbot|bot|gpt)\s*(?::|\n)")
ROLE_LABEL = _rx(r"^\W{0,4}(?:user|human|me|customer|student|question|q|follow-?up(?: question)?)"
                 r"\s*:")
DRIFT_OPEN = _rx(  # anchored at the start of the turn (or of a sentence)
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
DRIFT_ANY = _rx(
    r"i hope (?:this|that) helps", r"let me know if you (?:have|need|want|'d like|would like)",
    r"feel free to (?:ask|reach out|let me know)", r"is there anything else (?:i can|you)",
    r"happy to help")
ANSWER_MARK = _rx(r"####\s*\$?-?\d", r"\\boxed\{", r"\bthe final answer is", r"^answer\s*:",
                  r"\b(?:so|therefore|thus|hence),? the (?:final )?answer is")
EQUATION = re.compile(  # bounded repeats keep it linear on long runs of numbers
    r"(?<![\d,.])\d[\d,.]{0,12}(?:\s*[-+*/×÷x]\s*\$?\d[\d,.]{0,12}){1,6}\s*=\s*\$?-?\d")
CONNECTIVE = _rx(r"^\W{0,4}(?:so|therefore|thus|hence|first|next|then|finally|now|step \d|"
                 r"the (?:final )?answer is)\b")
META = _rx(
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
USER_CUE = _rx(r"\b(?:you|your|you're|thanks|thank|i think|i thought|i believe|i got|i get|"
               r"i don't|i'm not sure|i'm confused|wait|hmm|why|how come|great job|good job|"
               r"well done|correct|you got it)\b")
ASKS = _rx(r"\?", r"\b(?:can|could|would|will) you\b", r"\bplease\b")
QUESTION_OPEN = (r"^\W{0,4}(?:what|which|who|whose|where|when|why|how|does|do|did|is|are|was|"
                 r"were)\b")  # a question without its question mark
REQUEST = _rx(
    r"\?", QUESTION_OPEN,
    r"\b(?:why|how|can you|could you|would you|please|i think|should be|shouldn't|wrong|mistake|"
    r"incorrect|not right|don't understand|you said|you wrote|you forgot|you missed|what if|"
    r"show me|explain)\b",
    r"^\W{0,4}(?:show|explain|tell|give|write|redo|try|use|add|convert|rewrite|list|make|change|"
    r"fix|do)\b")
_WHY = r"\b(?:por qué|pourquoi|warum|perché)\b|为什么"
STRONG_REF = _rx(r"\b(?:why|how come|how did|how do you|where did|where does|where do|did you|"
                 r"you (?:said|wrote|mentioned|used|got|did)|your|wait|instead|wrong|mistake|"
                 r"incorrect|not right|mean|shouldn't|should be|i think|i believe|i got)\b", _WHY)
REF_CUE = _rx(r"\b(?:you|that|this|those|these|it|step|explain|clarify|error)\b", _WHY)
CUTOFF = _rx(r"\b(?:stopped|cut off|got cut|cut short|mid-?sentence|incomplete|unfinished|"
             r"didn't finish|not finished|continue|finish|keep going|go on|rest of|"
             r"complete (?:it|the)|what's next|next step)\b")
NEW_ASK = _rx(r"^\W{0,4}(?:what|how|who|where|when|which|why|can|could|would|is|are|do|does|write|"
              r"tell|give|list|describe|explain|translate|create|generate|compose|name|suggest|"
              r"recommend|calculate|solve|find|rewrite|if|a|an)\b")
NEW_STORY = re.compile(  # "Tom has 7 marbles..."
    r"^\W{0,4}[A-Z][a-z]+ (?:has|had|is|was|buys|bought|wants|earns|reads|runs)\b")
DEICTIC = _rx(r"\b(?:this|(?:(?<=is )|(?<=was )|(?<=n't ))that|these|those|it|them|same|instead|"
              r"that(?! (?:a|an|the|every|each|she|he|they|there|his|her)\b)|"  # "so that every"
              r"again|above|previous|your|you said|what about|what if|how about)\b")  # 8 words
REACTS = _rx(r"\b(?:(?:the|your|this|that|my|an?)(?: \w+)? answers?|"  # not "Answer his..."
             r"steps?|solution|result|explain|explanation|calculation|example|"
             r"did you|you (?:made|got|did|said|wrote|used|forgot|missed|mean)|mistake|wrong|"
             r"incorrect|i got|i think|should be|correct|right|again|instead|also|else)\b")
# A turn that goes on from what came before it ("And how many people live there?"): its opening
# word continues a sentence it did not start, so what it asks about is in the answer (or the query).
# Not in signals_of: the shipped classifier was fit without it.
ELLIPSIS = _rx(r"^\W{0,4}(?:and|but|so|also|or|then|plus|what about|how about|et|mais|donc|alors|"
               r"y|pero|entonces|und|aber|e|ma|quindi)\b")
# Third-person pronouns and place adverbs: they point back to a person, thing or place named
# earlier, unless the turn names one first. "there" only where it is a place, not "is there".
ANAPHOR = _rx(r"\b(?:he|she|they|him|her|his|hers|their|theirs|its|them)\b",
              r"(?<!\bis )(?<!\bare )(?<!\bwas )(?<!\bwere )\bthere\b(?!\s*(?:is|are|was|were|'s|"
              r"be|been|will|would|can|could|should|might|may|must|exists?|seems?|appears?|"
              r"remains?|has|have|had|used)\b)",
              r"\b(?:allí|allá|ahí|dort|là)\b")
VARIES = _rx(r"^\W{0,4}how (?:much|many|long|far|often|old)\b",
             r"\b(?:if|suppose|supposing|assum\w*|instead|rather|would|could)\b")
MEANS = _rx(r"^\W{0,4}(?:so,? )?(?:does|doesn't|did) (?:that|this) mean\b",
            r"^\W{0,4}so (?:that|this) means\b")
STATES_ANSWER = _rx(r"^\W{0,4}the (?:final )?answer is(?P<neg>\s+not|n't)?:?\s*\$?"
                    r"(?P<n>-?\d[\d,]*(?:\.\d+)?)(?: [^\W\d_]+)?[^\w?]*$")  # "9 pebbles."
RESULT = _rx(r"(?:=|answer is:?|####|\\boxed\{)\s*\$?(-?\d[\d,]*(?:\.\d+)?)")  # results
FORMAT = _rx(  # a format instruction in the query ("Give the result as your final answer.")
    r"^\W{0,4}(?:please,? )?(?:give|do not|don't|put|write|express|round|provide|present|state|"
    r"return|show|enclose|include|answer)\b.{0,80}\b(?:answer|result|units?|decimal|boxed)\b")
WRAPPER = _rx(r"^\W{0,4}what(?: is|'s) the (?:answer|solution) to (?:the|this|the following)"
              r"(?: [\w-]+){0,4}? (?:question|problem|puzzle|riddle)\s*[:-]\s*")  # frames the rest


# ---- text helpers -------------------------------------------------------------------------------
def strip_special(text: str) -> str:
    return SPECIAL_TOKENS.sub(" ", unicodedata.normalize("NFKC", text).replace("’", "'")).strip()


def words_of(text: str) -> list[str]:
    return WORD.findall(HAN.sub(r" \1 ", text.lower()))


def stem(word: str) -> str:
    for suffix in ("'s", "ing", "ed", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 2:
            word = word[: -len(suffix)]
            break
    return (word[:-1] if len(word) >= 3 and word.endswith("e") else word)[:6]


class StemPool:
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


def content_stems(words: list[str]) -> list[str]:
    """Stems of the content words (no stopwords, no numbers)."""
    return [stem(w) for w in words
            if w not in STOPWORDS and not w.isdigit() and w not in NUMBER_WORDS]


def numbers_in(text: str, spelled: Iterable[str] = ()) -> set[str]:
    """Numbers written with digits, canonical ("1,000.50" -> "1000.5"), plus spelled-out ones."""
    found = {n.replace(",", "") for n in NUMBER.findall(text)}
    found = {n.rstrip("0").rstrip(".") if "." in n else n for n in found}
    return {re.sub(r"^0+(?=\d)", "", n) for n in found} | {
        NUMBER_WORDS[w] for w in spelled if w in NUMBER_WORDS}


def sentences_of(text: str) -> list[str]:
    ends = r"(?<!\bM[rs]\.)(?<!\bMrs\.)(?<!\bDr\.)(?<!\bvs\.)(?<=[.!?。！？])\s+"  # not "Ms. X"
    return [s for s in re.split(ends + r"|\n+", text) if s.strip()]


def ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


_CONTRACTED = re.compile(r"\b(what|that|it|there|here|who|where|how|when|which)'s\b")
_OPERATOR = set("+-*/×÷^=<>%")


def tokens_of(text: str) -> list[str]:
    """The text in order: lowercased words and marks, "what's" read as "what is"."""
    return re.findall(r"[^\W_]+|[^\w\s]", _CONTRACTED.sub(r"\1 is", strip_special(text).lower()))


def sameness(text: str, target: str) -> float:
    """How much of ``text`` is ``target`` word for word and in order (0-1; difflib's ratio over
    words and marks); 0 where their numbers and operators differ, since "What is 12 + 7?" is
    another question than "What is 12 * 7?", and where their lengths rule out 0.9 anyway."""
    mine, theirs = tokens_of(text[:20000]), tokens_of(target[:20000])
    maths = [[t for t in tokens if t[0].isdigit() or t in _OPERATOR] for tokens in (mine, theirs)]
    if maths[0] != maths[1] or not 0.8 * len(theirs) <= len(mine) <= 1.25 * len(theirs):
        return 0.0
    return difflib.SequenceMatcher(None, mine, theirs, autojunk=False).ratio()


def names_in(text: str) -> set[str]:
    """Stems of the names a text uses: words capitalised inside a sentence ("I am Vicuna")."""
    return {stem(w.lower()) for s in sentences_of(text[:20000]) for w in WORD.findall(s)[1:]
            if w[:1].isupper() and w.lower() not in STOPWORDS}


def points_back(sentence: str) -> bool:
    """Does a pronoun or place adverb of ``sentence`` point back to someone or something the
    sentence does not name first? "Where was she born?" does; "A boy says he..." and "Tom says
    he..." name him first (a name, or "a"/"an" introducing someone; the first word is a name
    unless it is a function word or a verb of request)."""
    for found in ANAPHOR.finditer(sentence):
        before = WORD.findall(sentence[:found.start()])
        named = [w for w in before[1:] if w[:1].isupper() and w != "I"] + [
            w for w in before[:1] if w.lower() not in STOPWORDS and not NEW_ASK.match(w)]
        if not named and not {"a", "an"} & {w.lower() for w in before}:
            return True
    return False


def degenerate(text: str, words: list[str]) -> bool:
    """Degenerate repetition: looping characters, words, 3-grams, lines or sentences, or text
    that compresses too well."""
    compact = re.sub(r"\s+", "", text)[:4000]
    if len(compact) >= 6 and re.fullmatch(r"(.{1,30}?)\1{3,}.{0,30}", compact, re.S):
        return True
    if (len(words) >= 4 and len(set(words)) == 1) or (
            len(words) >= 12 and len(ngrams(words, 3)) < 0.4 * (len(words) - 2)):
        return True
    for units, least in ((text.splitlines(), 3), (sentences_of(text[:4000]), 4)):
        counts = Counter(unit.strip() for unit in units if unit.strip())
        top = counts.most_common(1)[0][1] if counts else 0
        if top >= least and top * 2 >= sum(counts.values()):  # one line or sentence, looping
            return True
    data = text.encode()
    return len(data) >= 300 and len(data) / len(zlib.compress(data, 9)) >= 3.5


def last_question(task: str) -> str:
    """The task's last question, from its question word on ("..., how many ... ?")."""
    asked = [s for s in sentences_of(task) if "?" in s]
    return re.split(r",\s*(?=(?:how|what|which|who|when|where)\b)", asked[-1], flags=re.I)[-1] \
        if asked else ""
