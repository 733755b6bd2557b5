"""The screen stage: find PII, secrets and prompt injection in a document's text before it is chunked and indexed.

The detectors are hand-written regular expressions with validators (Chinese ID checksum and birth date, Luhn, IBAN
mod-97), because Presidio and similar tools need spaCy models downloaded at run time, which this platform forbids, and
none of them covers Chinese formats.

Each category gets one policy action: allow (not even recorded), flag (recorded, text unchanged), redact (replaced
by "[REDACTED:<kind>]", or "[REDACTED:instruction]" for injection) or reject (the document is refused).

Choices that trade recall for precision, so ordinary documents do not trip the screen:
- A config value (`password = ...`, `token: ...`, `密码：...`) counts only when it has no spaces, is at least 6
  printable ASCII characters, contains a digit or one of !@#$%^&*+=?~, and is not a placeholder (<password>, ${VAR},
  $VAR, {{...}}, ******, changeme, your_..., example, the bare word password/secret). So "password: see the vault"
  and "reset your password every 90 days" pass, and so does an all-letter password (it reads like a word).
- Card numbers must start with 2-6 (every major network), which keeps timestamps and order numbers out.
- "you are now ..." / "你现在是..." count only when the sentence turns the model into an AI, assistant, DAN or an
  unrestricted role, so "You are now logged in" stays clean.
- Overlapping findings: the longest span wins, then the detector listed first (the more specific), then the earliest;
  the losers are dropped. So a connection string beats the "email" inside it, and an AWS key in `api_key = ...` is
  reported as aws_access_key rather than config_secret. Allowed categories are not run, so they never win an overlap.
"""

import datetime
import re
import string
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass

CATEGORIES = ("pii", "secret", "injection")
ACTIONS = ("allow", "flag", "redact", "reject")   # allow = do not even record findings of this category
DEFAULT_POLICY = {"pii": "flag", "secret": "redact", "injection": "flag"}

PREVIEW_LIMIT = 80
MASK = "*"


@dataclass(frozen=True)
class Finding:
    category: str      # one of CATEGORIES
    kind: str          # e.g. "email", "cn_mobile", "cn_id", "card", "aws_access_key", "private_key", "password"
    start: int         # offsets into the original text passed to screen_text
    end: int
    preview: str       # masked for pii/secret, the matched phrase (at most 80 characters) for injection
    action: str        # the policy's action applied to it: flag/redact/reject


@dataclass(frozen=True)
class ScreenResult:
    text: str                  # the text after redaction (unchanged when nothing is redacted)
    findings: list[Finding]    # ordered by start
    rejected: bool             # True when any finding's action is "reject"

    def reject_reason(self) -> str:
        if not self.rejected:
            return ""
        parts = []
        for category in CATEGORIES:
            kinds = [f.kind for f in self.findings if f.category == category and f.action == "reject"]
            if kinds:
                parts.append(f"{len(kinds)} {category} finding(s) ({', '.join(sorted(set(kinds)))})")
        return "Rejected by the knowledge base's screening policy: " + "; ".join(parts)


def validate_policy(policy: dict) -> dict:
    """Return the policy with every category present (defaults filled in); raise ValueError naming the bad key or
    value."""
    if not isinstance(policy, dict):
        raise ValueError(f"The screening policy must be a mapping of category to action, not {policy!r}")
    for category, action in policy.items():
        if category not in CATEGORIES:
            raise ValueError(f"Unknown screening category {category!r}; expected one of {', '.join(CATEGORIES)}")
        if action not in ACTIONS:
            raise ValueError(f"Unknown screening action {action!r} for {category!r}; "
                             f"expected one of {', '.join(ACTIONS)}")
    return {category: policy.get(category, DEFAULT_POLICY[category]) for category in CATEGORIES}


def screen_text(text: str, policy: dict | None = None) -> ScreenResult:
    policy = validate_policy(DEFAULT_POLICY if policy is None else policy)
    screened = {category for category, action in policy.items() if action != "allow"}
    hits = _without_overlaps(_hits(text, screened))
    findings = [_finding(text, hit, policy[hit.detector.category]) for hit in hits]
    return ScreenResult(text=_redacted(text, findings), findings=findings,
                        rejected=any(f.action == "reject" for f in findings))


# ---- masks: what a finding's preview shows ----

def _mask_middle(value: str, keep_start: int, keep_end: int) -> str:
    hidden = len(value) - keep_start - keep_end
    if hidden <= 0:
        return MASK * len(value)
    return value[:keep_start] + MASK * hidden + value[len(value) - keep_end:]


def _mask_token(value: str) -> str:
    # Long tokens (JWTs, project keys) keep a short preview: prefix, at most 16 stars, last 4.
    return value[:4] + MASK * min(len(value) - 8, 16) + value[-4:] if len(value) > 12 else MASK * len(value)


def _mask_digits_except_last(value: str, visible: int) -> str:
    """Mask every digit but the last `visible`, keeping separators: "4111 1111 1111 1111" -> "**** **** **** 1111"."""
    digit_count = sum(ch.isdigit() for ch in value)
    seen, out = 0, []
    for ch in value:
        if ch.isdigit():
            seen += 1
            out.append(ch if seen > digit_count - visible else MASK)
        else:
            out.append(ch)
    return "".join(out)


def _mask_last_digits(value: str, hidden: int = 4) -> str:
    """Mask the last `hidden` digits, keeping separators: "13800138000" -> "1380013****"."""
    out, remaining = [], hidden
    for ch in reversed(value):
        if ch.isdigit() and remaining:
            out.append(MASK)
            remaining -= 1
        else:
            out.append(ch)
    return "".join(reversed(out))


def _mask_email(value: str) -> str:
    local, domain = value.split("@", 1)
    return f"{local[0]}***@{domain}"


def _mask_card(value: str) -> str:
    return _mask_digits_except_last(value, 4)


def _mask_ssn(value: str) -> str:
    return "***-**-" + value[-4:]


def _mask_iban(value: str) -> str:
    return _mask_middle(value.replace(" ", ""), 4, 4)


def _mask_cn_id(value: str) -> str:
    return _mask_middle(value, 3, 4)


def _mask_aws_access_key(value: str) -> str:
    return _mask_middle(value, 4, 4)


def _mask_value(value: str) -> str:
    # Passwords and secret keys show nothing, not even their length.
    return MASK * 8


def _mask_connection_string(value: str) -> str:
    return re.sub(r":[^:/@\s]+@", ":****@", value, count=1)


def _mask_private_key(value: str) -> str:
    header_end = value.index("KEY-----") + len("KEY-----")    # "-----BEGIN RSA PRIVATE KEY-----"
    return value[:header_end] + " …"


def _clip_phrase(value: str) -> str:
    phrase = " ".join(value.split())
    return phrase if len(phrase) <= PREVIEW_LIMIT else phrase[:PREVIEW_LIMIT - 1] + "…"


# ---- validators: a regex match is a finding only when its validator agrees ----

def _always(match: re.Match) -> bool:
    return True


CN_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
CN_ID_CHECK_CHARS = "10X98765432"


def _valid_cn_id(match: re.Match) -> bool:
    number = match[0].upper()
    checksum = sum(int(digit) * weight for digit, weight in zip(number, CN_ID_WEIGHTS)) % 11
    if CN_ID_CHECK_CHARS[checksum] != number[17]:
        return False
    try:
        born = datetime.date(int(number[6:10]), int(number[10:12]), int(number[12:14]))
    except ValueError:
        return False
    return datetime.date(1900, 1, 1) <= born <= datetime.date.today()


def _luhn_valid(digits: str) -> bool:
    total = 0
    for position, digit in enumerate(reversed(digits)):
        value = int(digit)
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _valid_card(match: re.Match) -> bool:
    digits = re.sub(r"\D", "", match[0])
    return 13 <= len(digits) <= 19 and _luhn_valid(digits)


def _valid_iban(match: re.Match) -> bool:
    compact = match[0].replace(" ", "")
    if not 15 <= len(compact) <= 34:
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(ch, 36)) for ch in rearranged)) % 97 == 1


def _valid_ssn(match: re.Match) -> bool:
    area, group, serial = match[0].split("-")
    return area not in ("000", "666") and not area.startswith("9") and group != "00" and serial != "0000"


def _valid_phone_length(match: re.Match) -> bool:
    # E.164 numbers have at most 15 digits; fewer than 8 is a short code or a stray number.
    return 8 <= sum(ch.isdigit() for ch in match[0]) <= 15


def _contains_digit(match: re.Match) -> bool:
    # "sk-" followed by hyphenated words is prose; real keys are random and so contain digits.
    return any(ch.isdigit() for ch in match[0])


PLACEHOLDER = re.compile(
    r"""<[^>]*> | \$\{[^}]*\} | \$[A-Za-z_]\w* | \{\{.*\}\} | %\([^)]*\)s   # template and env references
      | (.)\1*                                                          # one repeated character: ******, xxxxxx
      | password | passwd | pass | pwd | secret | token
      | .*(?:changeme|change_me|example|placeholder|dummy|your[_-]).*""",
    re.IGNORECASE | re.VERBOSE)
SECRET_VALUE_SYMBOLS = set("!@#$%^&*+=?~")


def _is_placeholder(value: str) -> bool:
    return PLACEHOLDER.fullmatch(value) is not None


def _looks_like_secret_value(match: re.Match) -> bool:
    value = match["value"]
    return (len(value) >= 6 and not _is_placeholder(value)
            and any(ch.isdigit() or ch in SECRET_VALUE_SYMBOLS for ch in value))


def _real_connection_password(match: re.Match) -> bool:
    return not _is_placeholder(match["password"])


# ---- detectors ----
# Speed: Python's regex engine skips straight to a pattern's literal first character(s), but not when the pattern
# starts with an assertion or is case-insensitive. So most patterns start with their literal text, the left boundary
# is checked in code (not_after), and case-insensitive patterns are written in lower case and run on a lowercased copy
# of the text. Email and connection strings keep a leading lookbehind: it makes them start only at the beginning of a
# run of characters, which keeps a long unbroken run (a base64 blob) linear instead of quadratic; for the same reason
# the other open-ended repetitions have an upper bound.

@dataclass(frozen=True)
class _Detector:
    category: str
    kind: str
    pattern: re.Pattern
    mask: Callable[[str], str]
    accepts: Callable[[re.Match], bool] = _always
    not_after: str = ""            # characters that may not come right before the match
    lowercase: bool = False        # the pattern is lower case and runs on the lowercased text
    span_group: str | int = 0      # the part of the match that is the finding (a config value, not its key)


ALNUM = string.ascii_letters + string.digits
WORD_CHARS = ALNUM + "_"


# re.ASCII keeps Chinese characters from counting as word characters (\w, \s), so "电话13800138000" reads as a number.
def _ascii(pattern: str) -> re.Pattern:
    return re.compile(pattern, re.ASCII | re.VERBOSE)


def _secret(kind: str, pattern: str, mask: Callable[[str], str], **options) -> _Detector:
    return _Detector("secret", kind, _ascii(pattern), mask, **options)


def _pii(kind: str, pattern: str, mask: Callable[[str], str], **options) -> _Detector:
    return _Detector("pii", kind, _ascii(pattern), mask, **options)


def _instruction(kind: str, pattern: str, not_after: str = "") -> _Detector:
    return _Detector("injection", kind, re.compile(pattern, re.VERBOSE), _clip_phrase, not_after=not_after,
                     lowercase=True)


# Printable ASCII except space, quotes and backtick: what an unquoted config value is made of.
VALUE_CHAR = r"""[!#-&(-_a-~]"""
# A key ending in one of {keys}, an optional closing quote (JSON), a separator, then the value: either quoted, or
# running to the next space or quote less any trailing sentence punctuation. Lower case: it runs on the lowercased text.
CONFIG_VALUE = (r"""(?:{keys}) ["']? \s* (?:=>|:=|[:=：]) \s*
                    (?P<quote>["'])? (?P<value>""" + VALUE_CHAR + r"""+?)
                    (?(quote) (?P=quote) | [.,;]* (?!""" + VALUE_CHAR + "))")
PASSWORD_KEYS = "password|passwd|pwd|_pass|-pass|密码|口令"
CONFIG_SECRET_KEYS = ("secret|secret_key|secret-key|secretkey|api_key|api-key|apikey|access_token|access-token"
                      "|auth_token|auth-token|token|client_secret|client-secret|private_key|private-key|密钥")
TOKEN_EDGE = WORD_CHARS + "-"

SECRET_DETECTORS = [
    _secret("private_key",
            # The body may hold PEM headers (Proc-Type: 4,ENCRYPTED) and JSON-escaped line breaks (\n), but never
            # "-----": a BEGIN without an END stops at the next marker instead of rescanning the rest of the text.
            r"""-----BEGIN[ A-Z0-9]*PRIVATE\ KEY----- (?:[A-Za-z0-9+/=\s:,.\\] | -(?!----))*?
                -----END[ A-Z0-9]*PRIVATE\ KEY-----""",
            _mask_private_key),
    # The boundary check sits in the pattern, right after "eyJ": base64 of JSON repeats "eyJ" inside one long run, and
    # each of those would otherwise scan thousands of characters looking for the dot.
    _secret("jwt", r"eyJ (?<![\w-]eyJ) [\w-]{10,4096} \. [\w-]{10,8192} \. [\w-]{10,1024}", _mask_token),
    _secret("aws_access_key", r"(?:AKIA|ASIA)[A-Z0-9]{16} (?![A-Z0-9])", _mask_aws_access_key, not_after=ALNUM),
    _secret("aws_secret_key", r"""aws_secret_access_key ["']? \s* [:=] \s* ["']? (?P<value>[a-z0-9/+=]{40})
                                  (?![a-z0-9/+=])""", _mask_value, lowercase=True, span_group="value"),
    _secret("github_token", r"(?:gh[pousr]_[A-Za-z0-9]{20,255} | github_pat_\w{22,255})", _mask_token,
            not_after=TOKEN_EDGE),
    _secret("stripe_key", r"[sr]k_live_[A-Za-z0-9]{16,255}", _mask_token, not_after=TOKEN_EDGE),
    _secret("slack_token", r"xox[baprs]-[A-Za-z0-9-]{10,255}", _mask_token, not_after=TOKEN_EDGE),
    _secret("google_api_key", r"AIza[\w-]{35} (?![\w-])", _mask_token, not_after=TOKEN_EDGE),
    _secret("openai_key", r"sk-(?:proj-|svcacct-|admin-)?[\w-]{20,512}", _mask_token, accepts=_contains_digit,
            not_after=TOKEN_EDGE),
    _secret("connection_string",
            r"""(?<![\w+.-]) [A-Za-z][\w+.-]{0,30}:// [^\s:/@]{1,256} : (?P<password>[^\s:/@]{1,256})
                @ [A-Za-z0-9.-]{0,252}[A-Za-z0-9]""",
            _mask_connection_string, accepts=_real_connection_password),
    _secret("password", CONFIG_VALUE.format(keys=PASSWORD_KEYS), _mask_value, accepts=_looks_like_secret_value,
            lowercase=True, span_group="value"),
    _secret("config_secret", CONFIG_VALUE.format(keys=CONFIG_SECRET_KEYS), _mask_value,
            accepts=_looks_like_secret_value, lowercase=True, span_group="value"),
]

DIGIT_EDGE = ALNUM + "-"

PII_DETECTORS = [
    # region (6 digits), birth date (YYYYMMDD), sequence (3), check character
    _pii("cn_id", r"[1-9]\d{5} (?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01]) \d{3} [\dXx] (?![A-Za-z\d])",
         _mask_cn_id, accepts=_valid_cn_id, not_after=ALNUM),
    _pii("card", r"""[2-6] (?: \d{12,18}                                                    # contiguous
                             | \d{3} (?P<sep>[ -]) \d{4} (?P=sep) \d{4} (?P=sep) \d{1,4} (?:(?P=sep)\d{1,3})?
                             | \d{3} (?P<amex_sep>[ -]) \d{6} (?P=amex_sep) \d{5} )        # American Express 4-6-5
                     (?![A-Za-z0-9-])""", _mask_card, accepts=_valid_card, not_after=DIGIT_EDGE),
    _pii("iban", r"[A-Z]{2}\d{2} (?:\ ?[A-Z0-9]{4}){2,7} (?:\ ?[A-Z0-9]{1,4})? (?![A-Za-z0-9])", _mask_iban,
         accepts=_valid_iban, not_after=ALNUM),
    _pii("ssn", r"\d{3}-\d{2}-\d{4} (?![A-Za-z0-9-])", _mask_ssn, accepts=_valid_ssn, not_after=DIGIT_EDGE),
    _pii("email", r"""(?<![A-Za-z0-9._%+-]) [A-Za-z0-9._%+-]+ @ [A-Za-z0-9-]+ (?:\.[A-Za-z0-9-]+)* \.[A-Za-z]{2,}
                      (?![A-Za-z0-9-])""", _mask_email),
    _pii("cn_mobile", r"(?:\+86[ -]?1 | 0086[ -]?1 | 1)[3-9]\d (?:[ -]?\d{4}){2} (?![A-Za-z0-9])", _mask_last_digits,
         not_after=ALNUM + "+"),
    _pii("cn_service_number", r"400[ -]?\d{3}[ -]?\d{4} (?![A-Za-z0-9-])", _mask_last_digits, not_after=DIGIT_EDGE),
    _pii("cn_landline", r"(?:\(0\d{2,3}\)\ ? | 0\d{2,3}-) \d{7,8} (?![A-Za-z0-9-])", _mask_last_digits,
         not_after=DIGIT_EDGE),
    # North American: (555) 123-4567, 555-123-4567, +1 555.123.4567
    _pii("phone", r"(?:\+?1[ .-]?)? (?:\([2-9]\d{2}\)\ ? | [2-9]\d{2}[.-]) \d{3}[.-]\d{4} (?![A-Za-z0-9-])",
         _mask_last_digits, not_after=DIGIT_EDGE + "+"),
    # International: +CC, an optional (area code), then digit groups
    _pii("phone", r"\+\d{1,3} [ .-]? (?:\(\d{1,4}\)[ .-]?)? \d{1,4} (?:[ .-]?\d{2,4}){1,4} (?![\w-])",
         _mask_last_digits, accepts=_valid_phone_length, not_after=WORD_CHARS + "+"),
]

# Injection phrases are lower case (they run on the lowercased text) and tolerate any whitespace between words.
EN_INSTRUCTIONS = (r"(?:instructions?|prompts?|directions?|directives?|rules?|guidelines?|messages?|commands?|context"
                   r"|constraints?)\b")
EN_RESTRICTIONS = (r"(?:restrictions?|limits?|limitations?|filters?|rules?|guidelines?|censorship|safety|constraints?"
                   r"|boundaries)\b")
ZH_INSTRUCTIONS = r"(?:指令|指示|规则|提示词?|要求|设定|命令|说明|约束|限制)"
ZH_ALL = r"(?:(?:所有|全部|一切|任何)\s*(?:的\s*)?)?"

INJECTION_DETECTORS = [
    _instruction("ignore_instructions", r"""
        (?:ignore|disregard|forget|override|bypass)\s+ (?:(?:all|any|the|your|my|these|those|of)\s+)*
        (?:(?:previous|prior|above|earlier|preceding|foregoing|original|initial|system|developer)\s+)+"""
        + EN_INSTRUCTIONS, not_after=WORD_CHARS),
    _instruction("ignore_instructions", r"""
        (?:ignore|disregard|forget)\s+ (?:(?:all|any|the|your)\s+)*""" + EN_INSTRUCTIONS
        + r"\s+(?:above|before\s+this|given\s+(?:above|before|earlier)|so\s+far)\b", not_after=WORD_CHARS),
    _instruction("ignore_instructions", r"forget\s+(?:about\s+)?everything\b", not_after=WORD_CHARS),
    _instruction("ignore_instructions", r"""
        (?:忽略|忽视|无视|不要理会|不理会|不用理会|别管|跳过|忘记|忘掉|抛弃|放弃) \s*(?:掉\s*)?(?:你\s*)?""" + ZH_ALL
        + r"""(?:之前|以前|先前|此前|上面|上述|以上|前面|前述|上文|原来|原有|原先|系统)\s*
              (?:[\u4e00-\u9fff]{0,6}?\s*的\s*)?""" + ZH_ALL + ZH_INSTRUCTIONS),
    _instruction("ignore_instructions",
                 r"(?:忘记|忘掉|忘了)\s*(?:(?:之前|以前|上面)\s*的\s*)?(?:一切|所有\s*(?:的\s*)?(?:内容|事情|设定|东西))"),
    _instruction("role_override", r"""
        you\s+are\s+now\s+
        (?: (?:(?:a|an|the|my|your)\s+)? (?:[\w-]+\s+){0,3}?
            (?:ai|assistant|model|chatbot|bot|agent|gpt|llm|dan|jailbroken|unrestricted|unfiltered|uncensored)\b
          | in\s+(?:developer|god|dan|unrestricted|jailbreak)\s+mode\b
          | free\s+(?:of|from)\s+(?:(?:all|any|your)\s+)?""" + EN_RESTRICTIONS + r"""
          | no\s+longer\s+(?:bound|restricted|limited|an?\s+ai)\b
          | (?:called|named|known\s+as)\s+\S+\b )""", not_after=WORD_CHARS),
    _instruction("role_override", r"""
        (?:act|behave|respond|answer|pretend|roleplay)\s+(?:as|like|to\s+be)\b [^\n.]{0,60}?
        \b(?:without|with\s+no|free\s+(?:of|from)|ignoring)\s+(?:(?:any|all|your)\s+)?""" + EN_RESTRICTIONS,
                 not_after=WORD_CHARS),
    _instruction("role_override", r"""
        你\s*现在\s*(?:是|扮演|成为|变成)(?!否) [^\n。！？!?]{0,20}?
        (?:ai|人工智能|助手|模型|机器人|dan|没有\s*(?:任何\s*)?(?:限制|约束)|不受\s*(?:任何\s*)?(?:限制|约束)|无限制
           |开发者模式|越狱)"""),
    _instruction("role_override",
                 r"(?:扮演|充当|假装(?:成|是)?) [^\n。！？!?]{0,30}? "
                 r"(?:没有|不受|无|不带)\s*(?:任何\s*)?(?:限制|约束|规则|过滤|审查)"),
    _instruction("prompt_leak", r"""
        (?:reveal|print|show|output|repeat|display|leak|dump|tell\s+me|give\s+me|write\s+out)\s+
        (?:(?:your|the|me)\s+)* (?:(?:full|entire|complete|original|initial|hidden|secret|exact)\s+)*
        (?:system\s+(?:prompt|message|instructions?)|(?:initial|original|hidden)\s+(?:prompt|instructions?))\b""",
                 not_after=WORD_CHARS),
    _instruction("prompt_leak", r"""
        (?:输出|打印|显示|展示|透露|泄露|泄漏|告诉我|重复|复述|给出|列出|说出|公开)\s*(?:一下\s*)?(?:你\s*的\s*)?
        (?:(?:完整|全部|原始)\s*(?:的\s*)?)? (?:系统|初始|隐藏|原始)\s*(?:提示词?|指令|消息|设定|prompt)"""),
    _instruction("hide_from_user", r"""
        (?:do\s+not|don['’]t|never|must\s+not)\s+
        (?: (?:tell|inform|alert|notify)\s+the\s+user
          | (?:mention|reveal|disclose|say)\s+(?:(?:this|that|it|anything)\s+)?to\s+the\s+user
          | let\s+the\s+user\s+know )\b""", not_after=WORD_CHARS),
    _instruction("hide_from_user", r"""
        (?:不要|别|切勿|请勿|不得|不可|不能)\s*
        (?: (?:告诉|告知|透露给|通知|提醒)\s*(?:用户|使用者) | 让\s*(?:用户|使用者)\s*知道 )"""),
    _instruction("role_markup", r"""
        < (?: \|im_start\|>(?:\s*(?:system|user|assistant)\b)? | \|(?:system|user|assistant)\|>
            | \|start_header_id\|>\s*system\s*<\|end_header_id\|> | </?sys>> )
        | \[/?inst\] | \#\#\#\s*system\s*:"""),
]

# Order matters: on equal spans the detector listed first wins, so the more specific detectors come first.
DETECTORS = SECRET_DETECTORS + PII_DETECTORS + INJECTION_DETECTORS
REDACTION_LABELS = {"injection": "instruction"}   # other categories are labelled with the finding's kind


@dataclass(frozen=True)
class _Hit:
    start: int
    end: int
    rank: int            # the detector's position in DETECTORS: lower is more specific
    detector: _Detector


def _hits(text: str, categories: set[str]) -> list[_Hit]:
    lowered = _lowercased(text)
    hits = []
    for rank, detector in enumerate(DETECTORS):
        if detector.category in categories:
            subject = lowered if detector.lowercase else text
            hits += [_Hit(*match.span(detector.span_group), rank, detector) for match in _matches(detector, subject)]
    return hits


def _lowercased(text: str) -> str:
    # Offsets must carry over, and str.lower keeps every character's length except "İ", which becomes "i̇".
    return text.replace("\u0130", "i").lower()


def _matches(detector: _Detector, subject: str) -> Iterator[re.Match]:
    for match in detector.pattern.finditer(subject):
        start = match.start()
        if (start == 0 or subject[start - 1] not in detector.not_after) and detector.accepts(match):
            yield match


def _without_overlaps(hits: list[_Hit]) -> list[_Hit]:
    """Keep the longest hit of each overlapping group (then the most specific, then the earliest), in text order."""
    kept: list[_Hit] = []       # non-overlapping, ordered by start (and so by end too)
    kept_starts: list[int] = []
    for hit in sorted(hits, key=lambda h: (h.start - h.end, h.rank, h.start)):
        i = bisect_right(kept_starts, hit.start)
        overlaps_before = i > 0 and kept[i - 1].end > hit.start
        overlaps_after = i < len(kept) and kept[i].start < hit.end
        if not (overlaps_before or overlaps_after):
            kept.insert(i, hit)
            kept_starts.insert(i, hit.start)
    return kept


def _finding(text: str, hit: _Hit, action: str) -> Finding:
    detector = hit.detector
    return Finding(category=detector.category, kind=detector.kind, start=hit.start, end=hit.end,
                   preview=detector.mask(text[hit.start:hit.end]), action=action)


def _redacted(text: str, findings: list[Finding]) -> str:
    pieces, cursor = [], 0
    for finding in findings:
        if finding.action == "redact":
            label = REDACTION_LABELS.get(finding.category, finding.kind)
            pieces += [text[cursor:finding.start], f"[REDACTED:{label}]"]
            cursor = finding.end
    pieces.append(text[cursor:])
    return "".join(pieces)
