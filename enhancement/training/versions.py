"""The library versions a job's process supports, checked before it imports any of them.

A GPU node often comes with its own CUDA build of torch and transformers rather than the pinned set
(requirements/constraints.txt). The runner works across the ranges below, and refuses anything else at start with
one line naming what to install, rather than failing deep inside a job (a TypeError from an argument an older
transformers does not have, say).

transformers: from 5.17, which a CUDA node carried (the runner has been run end to end on it and on the pinned 5.23:
a LoRA and a full fine-tune of a two-layer model); transformers 4.x reads tokenizers saved by 5.x (every converted
base, every job output) as a class it does not know, so it is left out. torch and accelerate: what transformers 5
itself requires. peft: 0.18, its first release that works with transformers 5 (transformers PR 41889). Where an
argument was renamed within the range, run.py passes the name the installed version has
(`activation_checkpointing`, formerly `gradient_checkpointing`).
"""

from importlib import metadata

from packaging.version import InvalidVersion, Version

# distribution: (lowest supported, first unsupported)
SUPPORTED = {
    "torch": ("2.5", "3"),
    "transformers": ("5.17", "6"),
    "peft": ("0.18", "1"),
    "accelerate": ("1.1", "2"),
}
# The pinned set, with the CUDA build of torch on a node with NVIDIA GPUs.
INSTALL_PINNED = "make install (scripts/install.sh)"


class UnsupportedVersions(RuntimeError):
    pass


def _installed(distribution: str) -> Version | None:
    try:
        return Version(metadata.version(distribution))
    except metadata.PackageNotFoundError:
        return None
    except InvalidVersion:
        return Version("0")


def problems() -> list[str]:
    """Each library outside its range, as 'transformers 4.40.0 (needs >=5.17,<6)'."""
    found = []
    for name, (lowest, below) in SUPPORTED.items():
        version = _installed(name)
        # A local build label (2.13.0+cu130, 2.13.0+cpu) says how it was built, not which release it is.
        if version is None:
            found.append(f"{name} missing (needs >={lowest},<{below})")
        elif not Version(lowest) <= Version(version.base_version) < Version(below):
            found.append(f"{name} {version} (needs >={lowest},<{below})")
    return found


def check() -> None:
    """Raise UnsupportedVersions with one line naming what to install, when any library is outside its range."""
    found = problems()
    if found:
        wanted = " ".join(f"'{name}>={low},<{below}'" for name, (low, below) in SUPPORTED.items()
                          if any(line.startswith(f"{name} ") for line in found))
        raise UnsupportedVersions(f"This node's training libraries are outside what the runner supports: "
                                  f"{'; '.join(found)}. Install the pinned set with {INSTALL_PINNED}, or "
                                  f"pip install {wanted}.")
