import hashlib
import json
import math
import os
import random
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils.text import slugify
from django.utils.translation import gettext as _

from accounts.errors import Conflict, ValidationFailed
from accounts.models import Role, Workspace
from accounts.services import Actor, record_audit, require_role
from assets.models import AssetKind
from assets.services import register_asset
from cluster.models import FINISHED_JOB_STATES, Node, PriorityClass
from cluster.scheduling.pool import DeviceRequest, node_kind
from cluster.services import cancel_job as cancel_cluster_job, dispatch_job
from enhancement import planner, runner, selectors
from enhancement.files import SAMPLE_DATASET, dataset_path
from enhancement.formats import ColumnMapping, DatasetInvalid, parse_csv, parse_jsonl
from enhancement.hyperparameters import checked
from enhancement.jobs import REMOVE_FILES_KIND, RUN_KIND
from enhancement.model_shapes import model_shape, model_vocabulary, trainable_problem
from enhancement.models import Dataset, DatasetFormat, DistillMode, EnhancementJob, JobKind, Method
from enhancement.training.export import QUANTIZATIONS
from enhancement.training.pruning import METHODS as PRUNE_METHODS
from serving.engines import process
from serving.models import Deployment, Model, ModelKind
from serving.services import delete_model, deploy_model, model_users

SAMPLE_DATASET_NAME = "instructions-sample"
MAX_DATASET_BYTES = 200 * 1024 * 1024
# Beyond these a model is mostly gone: magnitude pruning keeps working far longer than removing whole channels.
MAX_SPARSITY = {"magnitude": 0.9, "mlp_channels": 0.75}


def _write_once(path: Path, content: bytes) -> None:
    """Files are named by their content, so an existing one is already right; a new one is written beside and
    renamed, so a reader never sees half of it."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with partial.open("wb") as out:
        out.write(content)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)


def upload_dataset(*, actor: Actor, workspace: Workspace, name: str, filename: str, content: bytes,
                   source_format: str = "", mapping: ColumnMapping | None = None, validation_share: float = 0.1,
                   seed: int = 42, description: str = "") -> Dataset:
    """Check every line, shuffle once with the seed, hold out the validation share, and store the conversations.
    Uploading under an existing name makes a new version of that dataset."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    name = name.strip()
    if not name:
        raise ValidationFailed("A dataset needs a name.", fields={"name": ["This field may not be blank."]})
    if source_format and source_format not in DatasetFormat.values:
        raise ValidationFailed(_("Unknown format '%(source_format)s'; use %(values)s.")
                               % {"source_format": source_format, "values": ', '.join(DatasetFormat.values)},
                               fields={"format": ["Unknown format."]})
    if not 0 <= validation_share <= 0.5:
        raise ValidationFailed("The validation share must be between 0 and 0.5.",
                               fields={"validation_share": ["Between 0 and 0.5."]})
    if len(content) > MAX_DATASET_BYTES:
        raise ValidationFailed(_("The file is %(value)s bytes, over the limit of %(limit)s.")
                               % {"value": len(content), "limit": MAX_DATASET_BYTES},
                               fields={"file": ["Too large."]})
    try:
        if source_format == DatasetFormat.CSV or (not source_format and filename.lower().endswith(".csv")):
            source_format, conversations = DatasetFormat.CSV, parse_csv(content, mapping=mapping or ColumnMapping())
        else:
            source_format, conversations = parse_jsonl(content, declared_format=source_format)
    except DatasetInvalid as exc:
        raise ValidationFailed(_("The dataset was not stored: %(exc)s") % {"exc": exc},
                               fields={"file": exc.errors[:20]})
    random.Random(seed).shuffle(conversations)
    validation_count = round(len(conversations) * validation_share)
    if validation_share and len(conversations) >= 2:
        validation_count = max(1, validation_count)
    if validation_count >= len(conversations):
        raise ValidationFailed(_("%(value)s sample(s) leave nothing to train on after the validation split.")
                               % {"value": len(conversations)},
                               fields={"validation_share": ["Too large for this dataset."]})
    normalised = "".join(json.dumps({"messages": c}, ensure_ascii=False) + "\n" for c in conversations).encode()
    sha256 = hashlib.sha256(normalised).hexdigest()
    _write_once(dataset_path(sha256), normalised)
    fields = {"source_format": source_format, "source_filename": filename[:255], "sha256": sha256,
              "sample_count": len(conversations), "validation_count": validation_count, "seed": seed}
    with transaction.atomic():
        dataset = Dataset.objects.select_for_update().filter(workspace=workspace, name=name).first()
        if dataset is None:
            dataset = Dataset.objects.create(workspace=workspace, name=name, description=description, **fields)
        else:
            for field, value in fields.items():
                setattr(dataset, field, value)
            dataset.description = description or dataset.description
            dataset.save()
        version = register_asset(workspace=workspace, kind=AssetKind.DATASET, ref_id=dataset.pk, name=name,
                                 payload={"sha256": sha256, "validation_count": validation_count, "seed": seed},
                                 summary={"samples": len(conversations), "format": source_format,
                                          "file": filename[:255]}, actor=actor)
        record_audit(actor=actor, workspace=workspace, action="dataset.upload", target=dataset,
                     detail={"samples": len(conversations), "version": version.number, "sha256": sha256})
    return dataset


def import_sample_dataset(*, actor: Actor, workspace: Workspace) -> Dataset:
    """The instruction dataset shipped with the platform (English and Chinese), stored as an upload would be."""
    return upload_dataset(actor=actor, workspace=workspace, name=SAMPLE_DATASET_NAME, filename=SAMPLE_DATASET.name,
                          content=SAMPLE_DATASET.read_bytes(),
                          description="Short instruction/answer pairs shipped with AI Factory (English and Chinese).")


def dataset_from_pairs(*, actor: Actor, workspace: Workspace, name: str, pairs: list[tuple[str, str]],
                       validation_share: float = 0.1) -> Dataset:
    """A dataset from prompt/answer pairs, such as a published app's approved answers (runtime exports them)."""
    lines = [json.dumps({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]},
                        ensure_ascii=False) for prompt, answer in pairs]
    return upload_dataset(actor=actor, workspace=workspace, name=name, filename="feedback.jsonl",
                          content="\n".join(lines).encode(), source_format=DatasetFormat.MESSAGES,
                          validation_share=validation_share)


def plan_devices(*, nodes: list[Node] | None = None, manual: list[dict] | None = None) -> list[planner.Device]:
    """Devices from the cluster registry (a node without GPUs is one CPU device), or entered by hand to plan for
    hardware that is not here: [{count, memory_gb, tflops, nodes?, kind?}]."""
    devices = []
    for entry in manual or []:
        try:
            count, memory_gb, tflops = int(entry["count"]), float(entry["memory_gb"]), float(entry["tflops"])
            node_count = int(entry.get("nodes") or 1)
        except (KeyError, TypeError, ValueError):
            raise ValidationFailed("Each device group needs a count, memory_gb and tflops (numbers).",
                                   fields={"devices": ["count, memory_gb and tflops are required."]})
        if count < 1 or memory_gb <= 0 or tflops <= 0 or node_count < 1 or count % node_count:
            raise ValidationFailed("Device counts, memory and TFLOPS must be positive, and the count a multiple of "
                                   "the nodes.", fields={"devices": ["Out of range."]})
        group = len({d.node for d in devices})
        for index in range(count):
            node = f"planned-{group + index * node_count // count + 1}"
            devices.append(planner.Device(node=node, name=f"{entry.get('kind', 'gpu')}{index}",
                                          memory_bytes=int(memory_gb * planner.GIB), tflops=tflops,
                                          kind=entry.get("kind", "gpu")))
    for node in nodes or []:
        gpus = list(node.devices.all())
        if gpus:
            devices += [planner.Device(node=node.name, name=gpu.name, memory_bytes=gpu.memory_bytes,
                                       tflops=gpu.compute_tflops or 100.0) for gpu in gpus]
        else:
            devices.append(planner.Device(node=node.name, name=f"{node.cpu_cores} CPU cores",
                                          memory_bytes=node.memory_bytes, kind="cpu",
                                          tflops=max(1, node.cpu_cores) * planner.CPU_CORE_TFLOPS))
    if not devices:
        raise ValidationFailed("Choose a node or enter devices to plan for.", fields={"devices": ["Required."]})
    return devices


def plan_training(*, model: Model, method: str, sequence_length: int, batch_size: int,
                  devices: list[planner.Device], lora_rank: int = 8,
                  lora_targets: tuple[str, ...] = ("q_proj", "v_proj")) -> planner.PlanResult:
    problem = trainable_problem(model)
    if problem:
        raise ValidationFailed(problem, fields={"base_model": [problem]})
    try:
        return planner.plan(shape=model_shape(model), devices=devices, work=planner.Workload(
            method=method, sequence_length=sequence_length, global_batch=batch_size, lora_rank=lora_rank,
            lora_targets=tuple(lora_targets)))
    except planner.PlanError as exc:
        raise ValidationFailed(str(exc), fields={"plan": [str(exc)]})


def _unique_name(workspace: Workspace, name: str) -> str:
    name = slugify(name)[:80]
    if not name:
        raise ValidationFailed("A job needs a name.", fields={"name": ["This field may not be blank."]})
    if EnhancementJob.objects.filter(workspace=workspace, name=name).exists():
        raise Conflict(_("A job called '%(name)s' already exists in this workspace.") % {"name": name})
    if Model.objects.filter(workspace=workspace, name__startswith=f"{name}-").exists():
        raise Conflict(_("Models named '%(name)s-…' already exist; choose another job name.") % {"name": name})
    return name


def _check_quantizations(quantizations: list[str]) -> list[str]:
    if not quantizations:
        raise ValidationFailed(_("Tick at least one export: without one the job would produce nothing."),
                               fields={"quantizations": [_("Choose at least one.")]})
    unknown = [q for q in quantizations if q not in QUANTIZATIONS]
    if unknown:
        raise ValidationFailed(_("Quantizations must be among %(values)s (got %(value)s).")
                               % {"values": ', '.join(QUANTIZATIONS), "value": ', '.join(unknown) or 'none'},
                               fields={"quantizations": ["Unknown type."]})
    return list(dict.fromkeys(quantizations))


def device_request(job: EnhancementJob, priority: str) -> DeviceRequest:
    """What the job asks of the pool: a device of its node's kind per data-parallel worker (one for a job without
    workers); between `min_workers` and `workers` for an elastic one, on the counts that keep its global batch
    whole (gradient accumulation makes up the rest: enhancement/runner.py resizes at a checkpoint)."""
    hyper = job.hyperparameters or {}
    workers = int(hyper.get("workers") or 1)
    least = int(hyper.get("min_workers") or workers)
    per_step, micro = int(hyper.get("batch_size") or 1), int(hyper.get("micro_batch_size") or 1)
    nodes = tuple(job.plan.get("nodes", [])) if len(job.plan.get("nodes", [])) > 1 else (job.node.name,)
    return DeviceRequest(device_kind=node_kind(job.node), min_devices=least, max_devices=workers,
                         priority=priority, spread=len(nodes) > 1, nodes=nodes,
                         sizes=tuple(n for n in range(least, workers + 1) if per_step % (n * micro) == 0))


def _dispatch(*, actor: Actor, job: EnhancementJob, priority: str = PriorityClass.NORMAL) -> EnhancementJob:
    cluster_job = dispatch_job(actor=actor, workspace=job.workspace, kind=RUN_KIND, node=job.node,
                               payload={"enhancement_job_id": job.pk}, request=device_request(job, priority))
    job.cluster_job = cluster_job
    job.save(update_fields=["cluster_job"])
    return job


def _check_training(*, workspace: Workspace, base_model: Model, dataset: Dataset, method: str) -> None:
    if method not in Method.values:
        raise ValidationFailed(_("Unknown method '%(method)s'; use lora or full.") % {"method": method},
                               fields={"method": ["Unknown."]})
    if dataset.workspace_id != workspace.pk:
        raise ValidationFailed("No such dataset in this workspace.", fields={"dataset": ["Unknown dataset."]})
    problem = trainable_problem(base_model)
    if problem:
        raise ValidationFailed(problem, fields={"base_model": [problem]})
    if not base_model.chat_template:
        raise ValidationFailed(_("'%(base_model)s' has no chat template, so its training samples cannot be rendered "
                                 "as it will be served; set one on Models & Serving first.")
                               % {"base_model": base_model.name},
                               fields={"base_model": ["No chat template."]})


def _planned_settings(*, base_model: Model, node: Node, method: str, hyperparameters: dict | None,
                      more_nodes: list[Node] | None = None) -> tuple[dict, dict]:
    """The checked training settings and the plan the job records. The plan is made over the devices of `node`
    and `more_nodes`; the job runs the best plan its trainer can run (data-parallel: the HF Trainer on each
    worker, joined by torch.distributed), whose data-parallel degree sets the workers (Ray when more than one)
    and whose micro-batch and recompute the settings take, unless they were given."""
    given = hyperparameters or {}
    hyper = checked(given)
    nodes = [node, *[extra for extra in more_nodes or [] if extra.pk != node.pk]]
    result = plan_training(model=base_model, method=method, sequence_length=hyper["cutoff"],
                           batch_size=hyper["batch_size"], devices=plan_devices(nodes=nodes),
                           lora_rank=hyper["lora_rank"], lora_targets=tuple(hyper["lora_targets"]))
    runnable = [p for p in result.plans if p.tensor_parallel == p.pipeline_parallel == 1 and not p.zero_stage]
    if not runnable:
        first = result.plans[0]
        raise ValidationFailed(
            _("Every layout that fits needs tensor or pipeline parallelism or ZeRO (the best: TP "
              "%(tensor_parallel)s, PP %(pipeline_parallel)s, ZeRO %(zero_stage)s), and this trainer runs "
              "data-parallel only. Use LoRA, a shorter cutoff, a smaller batch or devices with more memory.")
            % {"tensor_parallel": first.tensor_parallel, "pipeline_parallel": first.pipeline_parallel,
               "zero_stage": first.zero_stage},
            fields={"plan": ["No data-parallel layout fits."]})
    chosen = runnable[0]
    if "workers" not in given:
        hyper["workers"] = chosen.data_parallel
    if "recompute" not in given:
        hyper["recompute"] = chosen.recompute
    if chosen.nodes > 1 and hyper["workers"] != chosen.data_parallel:
        raise ValidationFailed(_("Across %(nodes)s nodes the plan trains on %(data_parallel)s data-parallel workers "
                                 "(one per device); leave 'workers' out or set it to that.")
                               % {"nodes": chosen.nodes, "data_parallel": chosen.data_parallel},
                               fields={"workers": [f"Must be {chosen.data_parallel} across these nodes."]})
    per_worker = hyper["batch_size"] // hyper["workers"]
    if hyper["micro_batch_size"] and per_worker % hyper["micro_batch_size"]:
        raise ValidationFailed(_("Each of the %(workers)s workers takes %(per_worker)s samples a step, which the "
                                 "micro-batch size (%(micro_batch)s) must divide.")
                               % {"workers": hyper['workers'], "per_worker": per_worker,
                                  "micro_batch": hyper['micro_batch_size']},
                               fields={"micro_batch_size": ["Must divide each worker's share of the batch."]})
    hyper["micro_batch_size"] = hyper["micro_batch_size"] or math.gcd(per_worker, chosen.micro_batch)
    hyper["gradient_accumulation"] = per_worker // hyper["micro_batch_size"]
    plan = {"chosen": chosen.as_dict(), "alternatives": [p.as_dict() for p in result.plans if p is not chosen][:5],
            "discarded": result.discarded, "nodes": [n.name for n in nodes]}
    calibration = selectors.step_calibration(node=node, base_model=base_model, method=method)
    if calibration:
        # Every layout's estimate scaled by what the last such job measured against its own estimate.
        for entry in [plan["chosen"], *plan["alternatives"]]:
            entry["raw_step_time_s"] = entry["step_time_s"]
            entry["step_time_s"] *= calibration["factor"]
            entry["tokens_per_s"] /= calibration["factor"]
        plan["calibration"] = calibration
    if chosen is not result.plans[0]:
        best = result.plans[0]
        plan["note"] = (f"The planner's first plan (TP {best.tensor_parallel}, PP {best.pipeline_parallel}, ZeRO "
                        f"{best.zero_stage}, {best.step_time_s:.3g} s a step) needs model or pipeline parallelism, "
                        f"which this trainer does not run; the job runs the best data-parallel plan "
                        f"({chosen.step_time_s:.3g} s a step).")
    return hyper, plan


def _create_job(*, actor: Actor, workspace: Workspace, kind: str, audit: dict,
                priority: str = PriorityClass.NORMAL, **fields) -> EnhancementJob:
    with transaction.atomic():
        job = EnhancementJob.objects.create(workspace=workspace, kind=kind, created_by=actor.user, **fields)
        record_audit(actor=actor, workspace=workspace, action=f"enhancement.{kind}", target=job, detail=audit)
        _dispatch(actor=actor, job=job, priority=priority)
    return job


def create_finetune_job(*, actor: Actor, workspace: Workspace, name: str, base_model: Model, dataset: Dataset,
                        node: Node, method: str = Method.LORA, hyperparameters: dict | None = None,
                        quantizations: list[str] | None = None, more_nodes: list[Node] | None = None,
                        keep_intermediates: bool = False, priority: str = PriorityClass.NORMAL) -> EnhancementJob:
    """Check the settings, plan the layout on the devices of `node` (and `more_nodes`, to train across them on
    a Ray cluster), and ask the pool for its devices in the `priority` class; once admitted, the node's worker
    runs the training."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    _check_training(workspace=workspace, base_model=base_model, dataset=dataset, method=method)
    hyper, plan = _planned_settings(base_model=base_model, node=node, method=method, hyperparameters=hyperparameters,
                                    more_nodes=more_nodes)
    quantizations = _check_quantizations(["q4_k_m"] if quantizations is None else quantizations)
    return _create_job(actor=actor, workspace=workspace, kind=JobKind.FINETUNE, name=_unique_name(workspace, name),
                       keep_intermediates=keep_intermediates,
                       base_model=base_model, dataset=dataset, dataset_sha256=dataset.sha256, method=method,
                       hyperparameters=hyper, quantizations=quantizations, plan=plan, node=node, priority=priority,
                       audit={"base_model": base_model.name, "dataset": dataset.name, "method": method})


def create_prune_job(*, actor: Actor, workspace: Workspace, name: str, base_model: Model, node: Node,
                     method: str, sparsity: float, recovery_steps: int = 0, dataset: Dataset | None = None,
                     quantizations: list[str] | None = None, hyperparameters: dict | None = None,
                     keep_intermediates: bool = False) -> EnhancementJob:
    """Prune a share of the model's weights (magnitude) or of its MLP channels (structured), optionally followed
    by a short LoRA fine-tune on `dataset` to recover; every output is measured against the base."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    problem = trainable_problem(base_model)
    if problem:
        raise ValidationFailed(problem.replace("trained", "compressed"), fields={"base_model": [problem]})
    if method not in PRUNE_METHODS:
        raise ValidationFailed(_("Unknown pruning method '%(method)s'; use %(values)s.")
                               % {"method": method, "values": ' or '.join(PRUNE_METHODS)},
                               fields={"method": ["Unknown."]})
    if not 0.05 <= sparsity <= MAX_SPARSITY[method]:
        raise ValidationFailed(_("The sparsity for %(method)s pruning must be between 0.05 and %(value)s (got "
                                 "%(sparsity)s).")
                               % {"method": method, "value": MAX_SPARSITY[method], "sparsity": sparsity},
                               fields={"sparsity": ["Out of range."]})
    if dataset is not None and dataset.workspace_id != workspace.pk:
        raise ValidationFailed("No such dataset in this workspace.", fields={"dataset": ["Unknown dataset."]})
    hyper, plan = {}, {}
    if recovery_steps:
        if dataset is None:
            raise ValidationFailed("A recovery fine-tune needs a dataset.", fields={"dataset": ["Required."]})
        _check_training(workspace=workspace, base_model=base_model, dataset=dataset, method=Method.LORA)
        hyper, plan = _planned_settings(base_model=base_model, node=node, method=Method.LORA,
                                        hyperparameters={**(hyperparameters or {}), "max_steps": recovery_steps})
    quantizations = _check_quantizations(["q8_0"] if quantizations is None else quantizations)
    return _create_job(actor=actor, workspace=workspace, kind=JobKind.PRUNE, name=_unique_name(workspace, name),
                       keep_intermediates=keep_intermediates,
                       base_model=base_model, dataset=dataset, dataset_sha256=dataset.sha256 if dataset else "",
                       method=Method.LORA if recovery_steps else "", hyperparameters=hyper, plan=plan,
                       quantizations=quantizations, node=node,
                       compression={"method": method, "sparsity": sparsity, "recovery_steps": recovery_steps},
                       audit={"base_model": base_model.name, "method": method, "sparsity": sparsity})


def _same_tokenizer(student: Model, teacher: Model) -> bool:
    try:
        return model_vocabulary(student) == model_vocabulary(teacher)
    except ValidationFailed:
        return False


def create_distill_job(*, actor: Actor, workspace: Workspace, name: str, student: Model, dataset: Dataset,
                       node: Node, mode: str, teacher_deployment: Deployment | None = None,
                       teacher_model: Model | None = None, method: str = Method.LORA,
                       hyperparameters: dict | None = None, quantizations: list[str] | None = None,
                       temperature: float = 2.0, alpha: float = 0.5, max_prompts: int = 200,
                       keep_intermediates: bool = False) -> EnhancementJob:
    """Teach `student` what a teacher does. sequence: the teacher deployment answers the dataset's prompts
    through the gateway, and the student is fine-tuned on those answers. logits: the student learns the teacher
    model's next-token distributions on the dataset's answers, which needs the same tokenizer."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    _check_training(workspace=workspace, base_model=student, dataset=dataset, method=method)
    if mode == DistillMode.SEQUENCE:
        if teacher_deployment is None:
            raise ValidationFailed("Sequence-level distillation needs a teacher deployment to answer the prompts.",
                                   fields={"teacher": ["Required."]})
        if not 1 <= max_prompts <= 5000:
            raise ValidationFailed("max_prompts must be between 1 and 5000.", fields={"max_prompts": ["Out of range."]})
        teacher = {"deployment": teacher_deployment.name}
    elif mode == DistillMode.LOGITS:
        if teacher_model is None:
            raise ValidationFailed("Logit distillation needs a teacher model with its files on this platform.",
                                   fields={"teacher": ["Required."]})
        problem = trainable_problem(teacher_model)
        if problem:
            raise ValidationFailed(problem.replace("trained", "used as a teacher"), fields={"teacher": [problem]})
        if not _same_tokenizer(student, teacher_model):
            raise ValidationFailed(_("'%(teacher_model)s' and '%(student)s' tokenize differently, so their "
                                     "next-token distributions cannot be compared; use sequence-level distillation.")
                                   % {"teacher_model": teacher_model.name, "student": student.name},
                                   fields={"teacher": ["Different tokenizer."]})
        if not (temperature > 0 and 0 <= alpha <= 1):
            raise ValidationFailed("The temperature must be above 0 and alpha between 0 and 1.",
                                   fields={"temperature": ["Out of range."]})
        teacher = {"model": teacher_model.name, "path": teacher_model.path, "temperature": temperature,
                   "alpha": alpha}
    else:
        raise ValidationFailed(_("Unknown distillation mode '%(mode)s'; use sequence or logits.") % {"mode": mode},
                               fields={"mode": ["Unknown."]})
    hyper, plan = _planned_settings(base_model=student, node=node, method=method, hyperparameters=hyperparameters)
    quantizations = _check_quantizations(["q4_k_m"] if quantizations is None else quantizations)
    return _create_job(actor=actor, workspace=workspace, kind=JobKind.DISTILL, name=_unique_name(workspace, name),
                       keep_intermediates=keep_intermediates,
                       base_model=student, dataset=dataset, dataset_sha256=dataset.sha256, method=method,
                       hyperparameters=hyper, quantizations=quantizations, plan=plan, node=node,
                       compression={"mode": mode, "max_prompts": max_prompts, **teacher},
                       audit={"student": student.name, "mode": mode, "teacher": teacher.get("deployment")
                              or teacher.get("model"), "dataset": dataset.name})


def create_quantize_job(*, actor: Actor, workspace: Workspace, name: str, base_model: Model, node: Node,
                        quantizations: list[str], dataset: Dataset | None = None,
                        keep_intermediates: bool = False) -> EnhancementJob:
    """GGUF quantizations of a registered model, with a report against it on `dataset`'s validation split (the
    shipped sample dataset when none is given)."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    problem = trainable_problem(base_model)
    if problem:
        raise ValidationFailed(problem.replace("trained", "compressed"), fields={"base_model": [problem]})
    if dataset is not None and dataset.workspace_id != workspace.pk:
        raise ValidationFailed("No such dataset in this workspace.", fields={"dataset": ["Unknown dataset."]})
    quantizations = _check_quantizations(quantizations)
    if base_model.kind == ModelKind.GGUF and "f16" in quantizations:
        raise ValidationFailed("A GGUF model cannot be turned back into f16; choose q8_0 or q4_k_m.",
                               fields={"quantizations": ["f16 needs a Hugging Face model."]})
    return _create_job(actor=actor, workspace=workspace, kind=JobKind.QUANTIZE, name=_unique_name(workspace, name),
                       keep_intermediates=keep_intermediates,
                       base_model=base_model, dataset=dataset, dataset_sha256=dataset.sha256 if dataset else "",
                       quantizations=quantizations, node=node,
                       audit={"base_model": base_model.name, "quantizations": quantizations})


def cancel_job(*, actor: Actor, job: EnhancementJob) -> EnhancementJob:
    """Cancel the cluster job; the node's worker kills the job's process group within a second. On this node the
    group is killed at once, in case no worker is watching it (one that died)."""
    require_role(actor=actor, workspace=job.workspace, role=Role.DEVELOPER)
    if job.cluster_job is None or job.cluster_job.state in FINISHED_JOB_STATES:
        raise Conflict(_("Job '%(job)s' has already %(state)s.") % {"job": job.name, "state": job.state})
    cancel_cluster_job(actor=actor, job=job.cluster_job)
    if job.node.name == settings.NODE_NAME and runner.is_running(job):
        process.terminate(job.pid)
    job.refresh_from_db()
    return job


@model_users.registering("enhancement")
def _jobs_using_model(model: Model) -> list[str]:
    names = EnhancementJob.objects.filter(base_model=model).values_list("name", flat=True)
    return [_("enhancement job '%(name)s'") % {"name": name} for name in names]


def delete_job(*, actor: Actor, job: EnhancementJob) -> int:
    """Delete the job with its output models and its run directory (checkpoints, weights, log); a job still
    running is cancelled and its process stopped first. Refused, naming them, while a deployment or another job
    uses one of its outputs. Returns the bytes freed on this node (0 when its files are on another node, where
    a job of that node's worker removes them)."""
    require_role(actor=actor, workspace=job.workspace, role=Role.DEVELOPER)
    outputs = list(job.output_models.all())
    uses = [use for model in outputs for users in model_users.entries() for use in users(model)]
    if uses:
        raise Conflict(_("The outputs of job '%(job)s' are in use by %(uses)s; remove those first.")
                       % {"job": job.name, "uses": ", ".join(uses)})
    if job.cluster_job is not None and job.cluster_job.state not in FINISHED_JOB_STATES:
        cancel_cluster_job(actor=actor, job=job.cluster_job)
    local = job.node.name == settings.NODE_NAME
    if local and runner.is_running(job):
        process.terminate(job.pid)
    directory = runner.run_dir(job)
    with transaction.atomic():
        for model in outputs:
            delete_model(actor=actor, model=model)
        record_audit(actor=actor, workspace=job.workspace, action="enhancement.delete", target=job,
                     detail={"outputs": [model.name for model in outputs]})
        job.delete()
        if not local:
            dispatch_job(actor=actor, workspace=job.workspace, kind=REMOVE_FILES_KIND, node=job.node,
                         payload={"run_dir": str(directory)})
    return runner.remove_run_dir(directory) if local else 0


def deploy_output(*, actor: Actor, job: EnhancementJob, model: Model, node: Node | None = None) -> Deployment:
    """One click: serve one of the job's outputs, on `node` (this server's node by default)."""
    require_role(actor=actor, workspace=job.workspace, role=Role.DEVELOPER)
    if not job.output_models.filter(pk=model.pk).exists():
        raise ValidationFailed(_("'%(model)s' is not an output of job '%(job)s'.")
                               % {"model": model.name, "job": job.name},
                               fields={"model": ["Not this job's output."]})
    deployment, _created = deploy_model(actor=actor, workspace=job.workspace, model=model, node=node)
    return deployment
