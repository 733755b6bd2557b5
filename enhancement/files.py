"""Where enhancement's files live under FACTORY_DATA_DIR: datasets by the sha256 of their stored form, and each job's
run directory (layout in enhancement/runner.py)."""

from pathlib import Path

from django.conf import settings

SAMPLE_DATASET = Path(__file__).resolve().parent / "samples" / "instructions.jsonl"


def dataset_path(sha256: str) -> Path:
    return Path(settings.DATA_DIR) / "enhancement" / "datasets" / f"{sha256}.jsonl"


def run_dir(job_id: int) -> Path:
    return Path(settings.DATA_DIR) / "enhancement" / "jobs" / str(job_id)
