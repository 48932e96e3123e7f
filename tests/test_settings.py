"""One config reader (asrtrain.settings.read) for every stage's section: defaults in one place,
equal to the YAML groups of conf/; unknown keys and wrong types refused in one line naming
``<section>.<key>``, through the CLI too."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import forked_cli
import pytest
from omegaconf import OmegaConf

from asrtrain import AsrtrainError
from asrtrain.align.config import TRI_DEFAULTS, AlignConfig, GmmConfig, align_settings
from asrtrain.decode import CtcDecodeConfig, GmmDecodeConfig, HybridDecodeConfig
from asrtrain.features.extract import FeatureOptions, FeaturesConfig, MfccConfig
from asrtrain.settings import defaults, read
from asrtrain.stages.ivectors import IvectorConfig
from asrtrain.stages.lang import LangConfig
from asrtrain.stages.lm import LmConfig
from asrtrain.stages.score import ScoreConfig

REPO = Path(__file__).resolve().parents[1]


def _yaml(path: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(REPO / "conf" / path), resolve=False)


@pytest.mark.parametrize(("group", "cls", "not_listed", "not_defaults"), [
    # resample comes from corpus.resample, num_ceps is MFCC's, append the hybrid's 260 dims
    ("features/fbank40.yaml", FeaturesConfig, {"resample", "num_ceps", "append"}, set()),
    ("mfcc/kaldi13.yaml", MfccConfig, {"resample"}, set()),
    ("ivector/default.yaml", IvectorConfig, set(), set()),
    ("lm/tg.yaml", LmConfig, set(), set()),
    ("lang/bpe500.yaml", LangConfig, set(), set()),
    ("score/hub5.yaml", ScoreConfig, set(), set()),
    ("decode/ctc_greedy.yaml", CtcDecodeConfig, set(), set()),
    # every key listed; passes is the recipe's own (mono..tri4 at the tiny corpus's size), no
    # default: the dataclass has none (each pass's defaults are GmmConfig's, checked below)
    ("align/tiny.yaml", AlignConfig, set(), {"passes"}),
])
def test_yaml_defaults_are_the_dataclass_defaults(group: str, cls: type, not_listed: set[str],
                                                  not_defaults: set[str]) -> None:
    yaml = _yaml(group)
    fields = {f.name for f in dataclasses.fields(cls)}
    assert set(yaml) == fields - not_listed, (sorted(set(yaml) - fields),
                                              sorted(fields - set(yaml)))
    yaml = {k: v for k, v in yaml.items() if k not in not_defaults}
    assert read(cls, yaml, group) == cls()
    assert {k: defaults(cls)[k] for k in yaml} == yaml   # nested sections key for key


def test_every_conf_group_and_recipe_section_reads() -> None:
    """What conf/ and the recipes give today stays valid."""
    for path in sorted((REPO / "conf" / "features").glob("*.yaml")):
        section = {k: v for k, v in _yaml(f"features/{path.name}").items() if k != "defaults"}
        FeatureOptions.from_config(section, "features")
    for path in sorted((REPO / "conf" / "align").glob("*.yaml")):
        align = align_settings({"align": _yaml(f"align/{path.name}")})
        assert (align.source, align.last, align.last_is_sat()) == ("train", "tri4", True)
        for name, opts in align.passes.items():
            gmm = {k: v for k, v in opts.items() if k not in ("from", "data")}
            GmmConfig.from_config(gmm, f"align.passes.{name}",
                                  **(TRI_DEFAULTS if opts.get("from") else {}))
    tiny = read(IvectorConfig, {k: v for k, v in _yaml("ivector/tiny.yaml").items()
                                if k != "defaults"}, "ivector")
    assert (tiny.ubm.num_gauss, tiny.ubm.num_gselect, tiny.extractor.gaussian_min_count) == (
        64, IvectorConfig().ubm.num_gselect, 10.0)
    assert read(LangConfig, _yaml("lang/char.yaml"), "lang").unit_type == "char"
    for path in sorted((REPO / "conf" / "lm").glob("*.yaml")):
        read(LmConfig, _yaml(f"lm/{path.name}"), "lm")
    for path in sorted((REPO / "conf" / "hybrid").glob("*.yaml")):
        HybridDecodeConfig.from_config(_yaml(f"hybrid/{path.name}").get("decode"),
                                       "hybrid.decode")


def test_defaults_fill_the_rest_and_values_are_typed() -> None:
    c = read(FeaturesConfig, {"num_mel_bins": 80, "dither": 0, "append": ["fmllr"]}, "features")
    assert (c.num_mel_bins, c.dither, c.append) == (80, 0.0, ("fmllr",))
    assert isinstance(c.dither, float) and c.frame_shift == FeaturesConfig().frame_shift
    assert read(FeaturesConfig, None, "features") == FeaturesConfig()
    assert read(FeaturesConfig, c, "features") is c
    # the extraction options only: what the arks' key is made of
    assert FeatureOptions.from_config({"delta_order": 2}, "features") == FeatureOptions()
    assert FeatureOptions.from_config({}, "mfcc").kind == "mfcc"
    g = GmmConfig.from_config({"num_leaves": 200}, "align.passes.tri1", **TRI_DEFAULTS)
    assert (g.num_leaves, g.num_iters, g.realign_iters) == (200, 35, (10, 20, 30))


@pytest.mark.parametrize(("read_it", "message"), [
    (lambda: FeatureOptions.from_config({"bogus": 1}, "features"),
     "features.bogus: unknown setting; known: append, delta_order, dither,"),
    (lambda: FeatureOptions.from_config({"kind": "plp"}, "mfcc"),
     "mfcc.kind='plp': expected one of fbank, mfcc"),
    (lambda: FeatureOptions.from_config({"num_mel_bins": "forty"}, "features"),
     "features.num_mel_bins='forty': expected an integer >= 1"),
    (lambda: FeatureOptions.from_config({"delta_order": -1}, "hybrid.features"),
     "hybrid.features.delta_order=-1: expected an integer >= 0"),
    (lambda: FeatureOptions.from_config({"append": "fmllr"}, "features"),
     "features.append='fmllr': expected a list"),
    (lambda: FeatureOptions.from_config({"use_energy": "no"}, "features"),
     "features.use_energy='no': expected true or false"),
    (lambda: GmmConfig.from_config({"num_leaves": 2.5}, "align.passes.tri1"),
     "align.passes.tri1.num_leaves=2.5: expected an integer"),
    (lambda: GmmConfig.from_config({"realign_iters": [1, "x"]}, "align.passes.mono"),
     r"align.passes.mono.realign_iters\[1\]='x': expected an integer"),
    (lambda: GmmConfig.from_config({"type": "fmllr"}, "align.passes.tri4"),
     "align.passes.tri4.type='fmllr': expected one of deltas, lda_mllt, sat"),
    (lambda: GmmConfig.from_config({"splice_opts": 3}, "align.passes.tri3"),
     "align.passes.tri3.splice_opts: unknown setting; known: acoustic_scale,"),
    (lambda: align_settings({"align": {"bogus": 1}}),
     "align.bogus: unknown setting; known: decode, decode_options, kaldi_dir, kaldi_fmllr, "
     "num_pdfs, passes, source$"),
    (lambda: align_settings({"align": {"source": "kaldy"}}),
     "align.source='kaldy': expected one of train, kaldi"),
    (lambda: align_settings({"align": {"num_pdfs": 0}}),
     "align.num_pdfs=0: expected an integer >= 1"),
    (lambda: align_settings({"align": {"decode": "yes"}}),
     "align.decode='yes': expected true or false"),
    (lambda: align_settings({"align": {"passes": [{"mono": {}}]}}),
     r"align.passes=\[\{'mono': \{\}\}\]: expected a mapping of pass name -> options"),
    (lambda: align_settings({"align": {"passes": {"mono": {"from": None, "cels": 5}}}}),
     "align.passes.mono.cels: unknown setting; known: acoustic_scale,"),
    (lambda: align_settings({"align": {"passes": {"mono": {"from": None},
                                                  "tri1": {"from": "tri2"}}}}),
     "align.passes.tri1.from='tri2': the first pass starts from nothing"),
    (lambda: align_settings({"align": {"passes": {"mono": {"from": None},
                                                  "tri1": {"from": "mono", "type": "sat"}}}}),
     "align.passes.tri1.type=sat: its from pass 'mono' is of type 'deltas'"),
    (lambda: align_settings({"align": {"passes": {"mono": {"from": None, "data": [{"x": 1}]}}}}),
     "align.passes.mono.data: unknown subset rule 'x'"),
    (lambda: read(IvectorConfig, {"online": {"period": 0}}, "ivector"),
     "ivector.online.period=0: expected an integer >= 1"),
    (lambda: read(IvectorConfig, {"ubm": {"num_gaus": 8}}, "ivector"),
     "ivector.ubm.num_gaus: unknown setting; known: min_gaussian_weight, num_frames,"),
    (lambda: read(IvectorConfig, {"ubm": 8}, "ivector"),
     "ivector.ubm=8: expected a mapping of num_gauss,"),
    (lambda: read(IvectorConfig, {"kaldi_dirs": ["a"]}, "ivector"),
     r"ivector.kaldi_dirs=\['a'\]: expected a mapping"),
    (lambda: read(LmConfig, {"order": 0}, "lm"), "lm.order=0: expected an integer >= 1"),
    (lambda: read(LangConfig, {"sil_prob": 1.5}, "lang"),
     "lang.sil_prob=1.5: expected a number >= 0 and <= 1"),
    (lambda: read(ScoreConfig, {"backend": "perl"}, "score"),
     "score.backend='perl': expected one of python, sclite"),
    (lambda: CtcDecodeConfig.from_config({"checkpoint": "worst"}),
     "decode.checkpoint='worst': expected one of best, last, average"),
    (lambda: CtcDecodeConfig.from_config({"beam": 3}),
     "decode.beam: unknown setting; known: average_n, batch_frames, checkpoint, kind"),
    (lambda: GmmDecodeConfig.from_config({"beam": "wide"}, "align.decode"),
     "align.decode.beam='wide': expected a number"),
    (lambda: HybridDecodeConfig.from_config({"wips": [0, None]}, "hybrid.decode"),
     r"hybrid.decode.wips\[1\]=None: expected a number"),
])
def test_bad_settings_are_one_line_naming_the_key(read_it, message: str) -> None:
    with pytest.raises(AsrtrainError, match=message) as e:
        read_it()
    assert "\n" not in str(e.value)


def test_an_unknown_key_on_the_command_line_is_one_line(tmp_path: Path) -> None:
    """Through the CLI, before anything runs: Hydra's refusal of a new key and the stage's
    check of an added one say the same line."""
    for override in ("features.bogus=1", "+features.bogus=1", "+mfcc.bogus=1",
                     "+align.bogus=1"):
        proc = forked_cli.run("run", "recipes/tiny",
                              f"exp_dir={tmp_path / 'exp'}", override, "--dry-run", timeout=300)
        section = override.lstrip("+").split(".")[0]
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"asrtrain: error: {section}.bogus: unknown setting; known: "), proc.stderr
        assert "delta_order" in lines[0] or section != "features"
    assert not (tmp_path / "exp").exists()
