"""The policy parser: `<split>.transform.auto_augment` strings -> a Policy, or an error that says
what is wrong, the grammar and the closest valid string.

The grammar is timm's (timm/data/auto_augment.py), as recipes write it:
- RandAugment `rand-m{M}[-n{N}][-mstd{S}][-mmax{X}][-inc{0|1}][-p{P}]`, sections in any order:
  magnitude M (default 10) on timm's 0..10 scale, N ops per image (2), magnitude noise: normal with
  std S, or uniform in [0, M] when S > 100 (0), the clip of the noisy magnitude (10), the
  'increasing' op set (0), each op applied with probability P (0.5);
  and timm's `t` section, the op set: `t3a` (3-Augment's three ops), `t3aw` (timm's weighted 3a set),
  `tweights` (timm's weighted default set); a weighted set draws its N ops without replacement;
- AutoAugment's ImageNet policies `original`, `v0` (and timm's `originalr`, `v0r`), `[-mstd{S}]`;
- `3a`: timm's 3-Augment policy (DeiT III's): one of solarize (threshold 128), grey, Gaussian blur
  (sigma uniform in [0.1, 2]); `three_augment` is the same policy under DeiT III's name;
- `ta_wide`: torchvision's TrivialAugmentWide (31 magnitude bins).

Only the standard library here: the config schema checks strings with it at load time.
"""
from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass

from ..errors import ConfigError

GRAMMAR = ("rand-m{M}[-n{N}][-mstd{S}][-mmax{X}][-inc{0|1}][-p{P}][-t{3a|3aw|weights}], original[-mstd{S}], "
           "v0[-mstd{S}], originalr, v0r, 3a (or three_augment) or ta_wide")
RAND_DEFAULTS = {"m": 10.0, "n": 2, "mstd": 0.0, "mmax": 10.0, "inc": 0, "p": 0.5}
AUTO_POLICIES = ("original", "originalr", "v0", "v0r", "3a")
THREE_AUGMENT = "three_augment"
"""DeiT III's name for timm's `3a` AutoAugment policy: the same ops, draws and pixels."""
TRIVIAL = "ta_wide"
MAX_LAYERS = 8
"""Most ops per image a RandAugment string may ask for: each is a branch of the DALI graph."""

RAND_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
            "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
"""timm's _RAND_TRANSFORMS: RandAugment's ops with inc0."""
RAND_INCREASING_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing",
                       "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                       "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
"""timm's _RAND_INCREASING_TRANSFORMS: RandAugment's ops with inc1."""

RAND_3A_OPS = ("SolarizeIncreasing", "Desaturate", "GaussianBlur")
"""timm's _RAND_3A: RandAugment's `t3a` op set."""
RAND_WEIGHTED_3A = {"SolarizeIncreasing": 6, "Desaturate": 6, "GaussianBlur": 6, "Rotate": 3, "ShearX": 2, "ShearY": 2,
                    "PosterizeIncreasing": 1, "AutoContrast": 1, "ColorIncreasing": 1, "SharpnessIncreasing": 1,
                    "ContrastIncreasing": 1, "BrightnessIncreasing": 1, "Equalize": 1, "Invert": 1}
"""timm's _RAND_WEIGHTED_3A: RandAugment's `t3aw` op set and each op's weight."""
RAND_WEIGHTED_0 = {"Rotate": 3, "ShearX": 2, "ShearY": 2, "TranslateXRel": 1, "TranslateYRel": 1,
                   "ColorIncreasing": .25, "SharpnessIncreasing": 0.25, "AutoContrast": 0.25, "SolarizeIncreasing": .05,
                   "SolarizeAdd": .05, "ContrastIncreasing": .05, "BrightnessIncreasing": .05, "Equalize": .05,
                   "PosterizeIncreasing": 0.05, "Invert": 0.05}
"""timm's _RAND_WEIGHTED_0: RandAugment's `tweights` op set and each op's weight."""
TRANSFORM_SETS = ("3a", "3aw", "weights")
"""The values of RandAugment's `t` section (timm's rand_augment_choices)."""

SubPolicy = tuple[tuple[str, float, int], ...]
"""(op name, probability, magnitude level) of each op of an AutoAugment sub-policy, in order."""

_V0: tuple[SubPolicy, ...] = (
    (("Equalize", 0.8, 1), ("ShearY", 0.8, 4)), (("Color", 0.4, 9), ("Equalize", 0.6, 3)),
    (("Color", 0.4, 1), ("Rotate", 0.6, 8)), (("Solarize", 0.8, 3), ("Equalize", 0.4, 7)),
    (("Solarize", 0.4, 2), ("Solarize", 0.6, 2)), (("Color", 0.2, 0), ("Equalize", 0.8, 8)),
    (("Equalize", 0.4, 8), ("SolarizeAdd", 0.8, 3)), (("ShearX", 0.2, 9), ("Rotate", 0.6, 8)),
    (("Color", 0.6, 1), ("Equalize", 1.0, 2)), (("Invert", 0.4, 9), ("Rotate", 0.6, 0)),
    (("Equalize", 1.0, 9), ("ShearY", 0.6, 3)), (("Color", 0.4, 7), ("Equalize", 0.6, 0)),
    (("Posterize", 0.4, 6), ("AutoContrast", 0.4, 7)), (("Solarize", 0.6, 8), ("Color", 0.6, 9)),
    (("Solarize", 0.2, 4), ("Rotate", 0.8, 9)), (("Rotate", 1.0, 7), ("TranslateYRel", 0.8, 9)),
    (("ShearX", 0.0, 0), ("Solarize", 0.8, 4)), (("ShearY", 0.8, 0), ("Color", 0.6, 4)),
    (("Color", 1.0, 0), ("Rotate", 0.6, 2)), (("Equalize", 0.8, 4), ("Equalize", 0.0, 8)),
    (("Equalize", 1.0, 4), ("AutoContrast", 0.6, 2)), (("ShearY", 0.4, 7), ("SolarizeAdd", 0.6, 7)),
    (("Posterize", 0.8, 2), ("Solarize", 0.6, 10)), (("Solarize", 0.6, 8), ("Equalize", 0.6, 1)),
    (("Color", 0.8, 6), ("Rotate", 0.4, 5)),
)
"""timm's auto_augment_policy_v0: the ImageNet policy of the TPU EfficientNet code."""

_ORIGINAL: tuple[SubPolicy, ...] = (
    (("PosterizeOriginal", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)), (("PosterizeOriginal", 0.6, 7), ("PosterizeOriginal", 0.6, 6)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Equalize", 0.4, 4), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, 7)), (("PosterizeOriginal", 0.8, 5), ("Equalize", 1.0, 2)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, 8), ("PosterizeOriginal", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, 2)),
    (("Equalize", 0.0, 7), ("Equalize", 0.8, 8)), (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, 8)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, 9)), (("Color", 0.4, 0), ("Equalize", 0.6, 3)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
)
"""timm's auto_augment_policy_original: AutoAugment's ImageNet policy (arXiv 1805.09501)."""


def _research_posterize(policy: tuple[SubPolicy, ...], name: str) -> tuple[SubPolicy, ...]:
    """timm's 'r' variants: the same policy with PosterizeIncreasing in place of `name`."""
    return tuple(tuple(("PosterizeIncreasing" if op == name else op, p, m) for op, p, m in sub) for sub in policy)


_3A: tuple[SubPolicy, ...] = (
    (("Solarize", 1.0, 5),), (("Desaturate", 1.0, 10),), (("GaussianBlurRand", 1.0, 10),),
)
"""timm's auto_augment_policy_3a: DeiT III's 3-Augment (solarize at threshold 128, grey, a blur of
sigma uniform in [0.1, 2]), one of the three per image."""

SUB_POLICIES = {"v0": _V0, "v0r": _research_posterize(_V0, "Posterize"), "original": _ORIGINAL,
                "originalr": _research_posterize(_ORIGINAL, "PosterizeOriginal"), "3a": _3A}


@dataclass(frozen=True)
class Policy:
    """A parsed auto_augment string: which ops a sample draws from, how many, how strong."""
    text: str
    family: str  # "rand", "auto" or "trivial"
    layers: int  # ops drawn per image (slots): N, 2 for AutoAugment, 1 for TrivialAugmentWide
    magnitude: float = 10.0
    magnitude_std: float = 0.0  # inf: uniform in [0, magnitude]
    magnitude_max: float = 10.0
    prob: float = 0.5
    increasing: bool = False
    sub_policies: tuple[SubPolicy, ...] = ()
    transforms: str = ""  # RandAugment's `t` section: "", "3a", "3aw" or "weights"

    @property
    def ops(self) -> tuple[str, ...]:
        """RandAugment: the ops each slot chooses from (uniformly with replacement, or by `weights`)."""
        if self.transforms == "3a":
            return RAND_3A_OPS
        if self.transforms in ("3aw", "weights"):
            return tuple((RAND_WEIGHTED_3A if self.transforms == "3aw" else RAND_WEIGHTED_0))
        return RAND_INCREASING_OPS if self.increasing else RAND_OPS

    @property
    def weights(self) -> tuple[float, ...] | None:
        """RandAugment with a weighted set: each op's weight (its N ops drawn without replacement, as
        timm's np.random.choice with p); None: uniform, with replacement."""
        table = {"3aw": RAND_WEIGHTED_3A, "weights": RAND_WEIGHTED_0}.get(self.transforms)
        return tuple(float(table[name]) for name in self.ops) if table else None

    @property
    def keeps_color_jitter(self) -> bool:
        """timm keeps colour jitter on with a 3a policy (3-Augment applies both); off with any other."""
        return "3a" in self.text or self.text == THREE_AUGMENT

    @property
    def fill_mean(self) -> bool:
        """timm fills what geometric ops uncover with the normalize mean colour; torchvision's
        TrivialAugmentWide with black (its fill default)."""
        return self.family != "trivial"

    def describe(self) -> str:
        """One line for logs and `fastloader check`."""
        if self.family == "trivial":
            return f"{self.text}: TrivialAugmentWide, 1 of 14 ops, magnitude uniform in 31 bins"
        noise = ("" if not self.magnitude_std else " uniform in [0, M]" if math.isinf(self.magnitude_std)
                 else f" + normal noise std {self.magnitude_std:g}")
        strength = f"magnitude {self.magnitude:g}{noise}, clipped to [0, {self.magnitude_max:g}]"
        if self.family == "auto":
            noise = f", levels + normal noise std {self.magnitude_std:g}" if self.magnitude_std else ""
            if self.sub_policies is SUB_POLICIES["3a"]:
                return f"{self.text}: 3-Augment, 1 of solarize, grey, Gaussian blur{noise}"
            return f"{self.text}: AutoAugment, 1 of {len(self.sub_policies)} sub-policies of 2 ops{noise}"
        kind = "increasing" if self.increasing else "timm's default"
        kind = {"3a": "3a", "3aw": "weighted 3a", "weights": "weighted"}.get(self.transforms, kind)
        return (f"{self.text}: RandAugment, {self.layers} of {len(self.ops)} ops ({kind} set), {strength}, "
                f"each applied with p {self.prob:g}")


class PolicyError(ConfigError):
    """A malformed auto_augment string; the message has the reason and the closest valid string."""


_SECTION = re.compile(r"([a-z]+)(.*)")


def parse_policy(text: str) -> Policy:
    """The Policy of an auto_augment string, or PolicyError naming what is wrong and a valid string."""
    reason, closest = policy_problem(text)
    if reason:
        raise PolicyError(f"{reason}; the grammar is {GRAMMAR}; closest valid form: {closest!r}")
    name, *sections = text.split("-")
    if name == TRIVIAL:
        return Policy(text, "trivial", 1)
    name = "3a" if name == THREE_AUGMENT else name
    transforms = next((section[1:] for section in sections if _split(section)[0] == "t"), "")
    values = {key: float(value) for key, value in map(_split, sections) if key != "t"}
    if name in AUTO_POLICIES:
        subs = SUB_POLICIES[name]
        return Policy(text, "auto", max(len(sub) for sub in subs), magnitude_std=values.get("mstd", 0.0),
                      sub_policies=subs)
    v = {**RAND_DEFAULTS, **values}
    mstd = math.inf if v["mstd"] > 100 else v["mstd"]  # timm: > 100 means uniform in [0, M]
    return Policy(text, "rand", int(v["n"]), magnitude=v["m"], magnitude_std=mstd, magnitude_max=v["mmax"],
                  prob=v["p"], increasing=bool(v["inc"]), transforms=transforms)


def _split(section: str) -> tuple[str, str]:
    if section[:1] == "t" and section[1:] in TRANSFORM_SETS:
        return "t", section[1:]
    match = _SECTION.fullmatch(section)
    return (match.group(1), match.group(2)) if match else (section, "")


def _number(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


_RAND_CHECKS = {
    "m": (lambda v: v >= 0, "a magnitude >= 0"),
    "n": (lambda v: v == int(v) and 1 <= v <= MAX_LAYERS, f"an integer from 1 to {MAX_LAYERS}"),
    "mstd": (lambda v: v >= 0, "a std >= 0 (> 100: uniform)"),
    "mmax": (lambda v: v > 0, "a clip > 0"),
    "inc": (lambda v: v in (0, 1), "0 or 1"),
    "p": (lambda v: 0 <= v <= 1, "a probability in [0, 1]"),
}


_SET_CHECK = (lambda v: v in TRANSFORM_SETS, f"one of the op sets {', '.join(TRANSFORM_SETS)}")


_NAMES_PEOPLE_WRITE = {"randaugment": "rand", "randaug": "rand", "ra": "rand", "autoaugment": "original",
                       "aa": "original", "trivialaugment": TRIVIAL, "trivialaugmentwide": TRIVIAL, "ta": TRIVIAL,
                       "deit3": THREE_AUGMENT, "3augment": THREE_AUGMENT}
"""The papers' names of the policies (underscores left out) -> the family a policy string starts with:
'randaugment' is RandAugment, not the string it is closest to by its letters ('three_augment')."""


def policy_problem(text) -> tuple[str, str]:
    """(what is wrong, the closest valid string), or ('', text) when it parses."""
    if not isinstance(text, str) or not text.strip():
        return f"expected a policy string, got {text!r}", "rand-m9-mstd0.5-inc1"
    clean = "".join(text.split()).lower()
    problems = [] if clean == text else ["lower case, without spaces"]
    name, *sections = clean.split("-")
    families = ["rand", TRIVIAL, THREE_AUGMENT, *AUTO_POLICIES]
    if name not in families:
        named = _NAMES_PEOPLE_WRITE.get(name.replace("_", ""))
        name = named or difflib.get_close_matches(name, families, n=1, cutoff=0.0)[0]
        if named == "rand" and not sections:
            sections = ["m9", "mstd0.5", "inc1"]  # timm's RandAugment of the DeiT and RSB recipes
        problems.append(f"unknown policy {clean.split('-')[0]!r}")
    if name == TRIVIAL:
        if sections:
            problems.append("ta_wide takes no options")
        return (f"{'; '.join(problems)} in {text!r}" if problems else ""), TRIVIAL
    allowed = {**_RAND_CHECKS, "t": _SET_CHECK} if name == "rand" else {"mstd": _RAND_CHECKS["mstd"]}
    fixed, seen = [name], set()
    for section in sections:
        key, value = _split(section)
        if key not in allowed:
            problems.append(f"unknown section {section!r} (the options of {name}: {', '.join(allowed)})")
            close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.5)
            if not close:
                continue  # nothing like it: left out of the closest form
            key = close[0]
        if key in seen:
            problems.append(f"section {key!r} given twice")
            continue
        seen.add(key)
        check, wants = allowed[key]
        if key == "t":
            if value not in TRANSFORM_SETS:
                problems.append(f"'t' must be {wants}, got {value!r}")
                value = "3a"
            fixed.append(f"t{value}")
            continue
        number = _number(value)
        if number is None or not check(number):
            problems.append(f"{key!r} must be {wants}, got {value!r}")
            value = "1" if key == "inc" and not value else _default_text(name, key)
        fixed.append(f"{key}{value}")
    return (f"{'; '.join(problems)} in {text!r}" if problems else ""), "-".join(fixed)


def _default_text(name: str, key: str) -> str:
    default = RAND_DEFAULTS[key] if name == "rand" else 0.0
    return f"{default:g}"
