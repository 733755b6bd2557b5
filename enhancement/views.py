from django.conf import settings
from django.contrib import messages
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.template.defaultfilters import filesizeformat
from django.utils.translation import gettext as _, gettext_lazy

from accounts.errors import ValidationFailed
from accounts.gui import gui_actor, workspace_page
from cluster.models import Node, PriorityClass
from cluster.scheduling.services import allowed_priorities
from enhancement import runner, selectors, services
from enhancement.formats import ColumnMapping
from enhancement.hyperparameters import LORA_TARGETS, RANGES, SCHEDULERS, checked
from enhancement.model_shapes import trainable_problem
from enhancement.models import DatasetFormat, DistillMode, Method
from enhancement.training.export import QUANTIZATIONS
from serving.models import RoleHint
from serving.selectors import deployments_visible_to, models_visible_to

# The new-job form's numeric settings, in the order shown.
HYPER_FIELDS = ["max_steps", "epochs", "learning_rate", "warmup_steps", "batch_size", "micro_batch_size", "cutoff",
                "lora_rank", "lora_alpha", "lora_dropout", "seed", "save_steps", "eval_steps"]
# The new-job form's request to the pool: the devices (one per data-parallel worker) as a range, min to max.
POOL_FIELDS = ["min_workers", "workers"]
# The prune form's methods: the value enhancement.services takes, and what the form shows.
PRUNE_METHODS = [("mlp_channels", gettext_lazy("MLP channels (structured)")),
                 ("magnitude", gettext_lazy("Magnitude (unstructured)"))]


def _trainable_models(workspace):
    return [m for m in models_visible_to(workspace=workspace).exclude(role_hint=RoleHint.EMBEDDING)
            if not trainable_problem(m)]


def _model(request, name: str):
    model = models_visible_to(workspace=request.workspace).filter(name=name).first()
    if model is None:
        raise ValidationFailed(_("Choose a model (no model called '%(name)s').") % {"name": name})
    return model


def _node(request) -> Node:
    node = Node.objects.filter(name=request.POST.get("node") or settings.NODE_NAME).first()
    if node is None:
        raise ValidationFailed(_("Choose a node of the pool."))
    return node


def _number(value: str, field: str, kind=float):
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValidationFailed(_("%(field)s must be a number, not '%(value)s'.") % {"field": field, "value": value})


def _with_reasons(plans: list) -> list:
    """The planner's plans with their `why` in the reader's language."""
    for entry, reasoned in zip(plans, selectors.with_reasons([entry.as_dict() for entry in plans])):
        entry.why = reasoned["why"]
    return plans


def _keep_intermediates(request) -> bool:
    return request.POST.get("keep_intermediates") == "on"


@workspace_page
def home(request):
    if request.method == "POST":
        actor = gui_actor(request)
        action = request.POST.get("action")
        if action == "sample":
            dataset = services.import_sample_dataset(actor=actor, workspace=request.workspace)
            messages.success(request, _("Added the sample dataset '%(name)s' (%(count)s samples).")
                             % {"name": dataset.name, "count": dataset.sample_count})
            return redirect("enhancement-dataset", dataset_id=dataset.pk)
        if action == "upload":
            upload = request.FILES.get("file")
            if upload is None:
                raise ValidationFailed(_("Choose a file to upload."))
            dataset = services.upload_dataset(
                actor=actor, workspace=request.workspace, name=request.POST.get("name", ""),
                filename=upload.name, content=upload.read(), source_format=request.POST.get("format", ""),
                validation_share=_number(request.POST.get("validation_share") or 0.1, _("Validation share")),
                mapping=ColumnMapping(instruction=request.POST.get("instruction_column") or "instruction",
                                      output=request.POST.get("output_column") or "output",
                                      input=request.POST.get("input_column", ""),
                                      system=request.POST.get("system_column", "")))
            messages.success(request, _("Stored '%(name)s': %(count)s samples, %(held)s held out for validation.")
                             % {"name": dataset.name, "count": dataset.sample_count,
                                "held": dataset.validation_count})
            return redirect("enhancement-dataset", dataset_id=dataset.pk)
        if action == "quantize":
            base = _model(request, request.POST.get("base_model", ""))
            dataset_id = request.POST.get("dataset")
            dataset = (selectors.scoped(selectors.datasets(workspace=request.workspace), dataset_id, "Dataset")
                       if dataset_id else None)
            job = services.create_quantize_job(actor=actor, workspace=request.workspace,
                                               name=request.POST.get("name", ""), base_model=base,
                                               node=_node(request), quantizations=request.POST.getlist("quantizations"),
                                               dataset=dataset, keep_intermediates=_keep_intermediates(request))
            return redirect("enhancement-job", job_id=job.pk)
        if action == "prune":
            dataset_id = request.POST.get("dataset")
            job = services.create_prune_job(
                actor=actor, workspace=request.workspace, name=request.POST.get("name", ""),
                base_model=_model(request, request.POST.get("base_model", "")), node=_node(request),
                method=request.POST.get("method", ""),
                sparsity=_number(request.POST.get("sparsity") or 0, _("Sparsity")),
                recovery_steps=_number(request.POST.get("recovery_steps") or 0, _("Recovery steps"), int),
                dataset=selectors.scoped(selectors.datasets(workspace=request.workspace), dataset_id, "Dataset")
                if dataset_id else None, quantizations=request.POST.getlist("quantizations"),
                keep_intermediates=_keep_intermediates(request))
            return redirect("enhancement-job", job_id=job.pk)
        if action == "distill":
            mode = request.POST.get("mode", "")
            teacher = request.POST.get("teacher", "")
            deployment = deployments_visible_to(workspace=request.workspace).filter(name=teacher).first()
            if mode == DistillMode.SEQUENCE and deployment is None:
                raise ValidationFailed(_("Sequence-level distillation needs a teacher deployment; '%(teacher)s' is "
                                         "not one.") % {"teacher": teacher})
            job = services.create_distill_job(
                actor=actor, workspace=request.workspace, name=request.POST.get("name", ""),
                student=_model(request, request.POST.get("student", "")),
                dataset=selectors.scoped(selectors.datasets(workspace=request.workspace),
                                         request.POST.get("dataset"), "Dataset"),
                node=_node(request), mode=mode, teacher_deployment=deployment,
                teacher_model=_model(request, teacher) if mode == DistillMode.LOGITS else None,
                hyperparameters={"max_steps": request.POST.get("max_steps") or 50},
                max_prompts=_number(request.POST.get("max_prompts") or 200, _("Prompts"), int),
                keep_intermediates=_keep_intermediates(request))
            return redirect("enhancement-job", job_id=job.pk)
        return redirect("enhancement")
    return render(request, "enhancement/home.html", {
        "datasets": selectors.datasets(workspace=request.workspace),
        "jobs": selectors.jobs(workspace=request.workspace)[:50],
        "formats": DatasetFormat.choices, "models": _trainable_models(request.workspace),
        "nodes": Node.objects.all(), "quantizations": _quantization_labels(), "this_node": settings.NODE_NAME,
        "prune_methods": PRUNE_METHODS,
        "distill_modes": DistillMode.choices,
        "deployments": [d for d in deployments_visible_to(workspace=request.workspace) if d.state == "ready"],
    })


@workspace_page
def dataset_page(request, dataset_id: int):
    dataset = selectors.scoped(selectors.datasets(workspace=request.workspace), dataset_id, "Dataset")
    models = _trainable_models(request.workspace)
    chosen = request.GET.get("model") or next((m.name for m in models if m.chat_template), "")
    cutoff = _number(request.GET.get("cutoff") or 512, _("Cutoff"), int)
    preview, problem = None, ""
    if chosen:
        try:
            preview = selectors.dataset_preview(dataset=dataset, model=_model(request, chosen), cutoff=cutoff)
        except ValidationFailed as exc:
            problem = exc.message
    peak = max((b["count"] for b in preview["histogram"]["bins"]), default=1) if preview else 1
    return render(request, "enhancement/dataset.html", {
        "dataset": dataset, "models": models, "chosen": chosen, "cutoff": cutoff, "preview": preview,
        "problem": problem, "peak": peak or 1})


def _hyper_from(post) -> dict:
    values = {name: post.get(name) for name in [*HYPER_FIELDS, *POOL_FIELDS] if post.get(name, "") != ""}
    values["lr_scheduler"] = post.get("lr_scheduler") or "linear"
    values["lora_targets"] = post.getlist("lora_targets") or ["q_proj", "v_proj"]
    if post.get("recompute") == "on":  # unticked, the plan decides
        values["recompute"] = True
    return values


def _quantization_labels() -> dict[str, str]:
    return {key: _(label) for key, label in QUANTIZATIONS.items()}


def _more_nodes(request) -> list[Node]:
    return list(Node.objects.filter(name__in=request.POST.getlist("more_nodes")))


@workspace_page
def new_job(request):
    """The form shows the planner's table for the chosen model, node and batch before the job starts."""
    post = request.POST if request.method == "POST" else None
    plan, problem = None, ""
    if post is not None:
        actor = gui_actor(request)
        dataset = selectors.scoped(selectors.datasets(workspace=request.workspace), post.get("dataset"), "Dataset")
        base = _model(request, post.get("base_model", ""))
        if post.get("action") == "start":
            job = services.create_finetune_job(
                actor=actor, workspace=request.workspace, name=post.get("name", ""), base_model=base,
                dataset=dataset, node=_node(request), method=post.get("method", Method.LORA),
                hyperparameters=_hyper_from(post), quantizations=post.getlist("quantizations"),
                more_nodes=_more_nodes(request), keep_intermediates=_keep_intermediates(request),
                priority=post.get("priority") or PriorityClass.NORMAL)
            messages.success(request, _("Queued '%(job)s' on %(node)s.") % {"job": job.name, "node": job.node.name})
            return redirect("enhancement-job", job_id=job.pk)
        hyper = checked(_hyper_from(post))
        try:
            plan = services.plan_training(model=base, method=post.get("method", Method.LORA),
                                          sequence_length=hyper["cutoff"], batch_size=hyper["batch_size"],
                                          devices=services.plan_devices(nodes=[_node(request),
                                                                               *_more_nodes(request)]),
                                          lora_rank=hyper["lora_rank"], lora_targets=tuple(hyper["lora_targets"]))
        except ValidationFailed as exc:
            problem = exc.message
    defaults = {name: RANGES[name][0] for name in HYPER_FIELDS} | {"workers": ""}  # blank: the plan's
    return render(request, "enhancement/new_job.html", {
        "datasets": selectors.datasets(workspace=request.workspace), "models": _trainable_models(request.workspace),
        "nodes": Node.objects.all(), "this_node": settings.NODE_NAME, "quantizations": _quantization_labels(),
        "schedulers": SCHEDULERS, "lora_targets": LORA_TARGETS, "methods": Method.choices,
        "fields": [(name, post.get(name, "") if post else defaults[name]) for name in HYPER_FIELDS],
        "form": post, "plan": _with_reasons(plan.plans[:10]) if plan else None,
        "discarded": plan.discarded if plan else None,
        "problem": problem,
        "chosen_targets": post.getlist("lora_targets") if post else ["q_proj", "v_proj"],
        "chosen_quantizations": post.getlist("quantizations") if post else ["q4_k_m"],
        "chosen_more_nodes": post.getlist("more_nodes") if post else [],
        "pool_fields": {name: post.get(name, "") if post else "" for name in POOL_FIELDS},
        # The classes the user's role may use: the pool refuses the others.
        "priorities": allowed_priorities(actor=gui_actor(request), workspace=request.workspace),
        "chosen_priority": post.get("priority") if post else PriorityClass.NORMAL,
    })


@workspace_page
def job_page(request, job_id: int):
    job = selectors.scoped(selectors.jobs(workspace=request.workspace), job_id, "Job")
    if request.method == "POST":
        actor = gui_actor(request)
        if request.POST.get("action") == "cancel":
            services.cancel_job(actor=actor, job=job)
            messages.success(request, _("Cancelled '%(job)s'; its training process was stopped.") % {"job": job.name})
        elif request.POST.get("action") == "delete":
            freed = services.delete_job(actor=actor, job=job)
            messages.success(request, _("Deleted '%(job)s' with its outputs and files (%(freed)s freed).")
                             % {"job": job.name, "freed": filesizeformat(freed)})
            return redirect("enhancement")
        elif request.POST.get("action") == "deploy":
            model = job.output_models.filter(pk=request.POST.get("model") or 0).first()
            if model is None:
                raise ValidationFailed(_("Choose one of the job's outputs to deploy."))
            deployment = services.deploy_output(actor=actor, job=job, model=model)
            messages.success(request, _("Deploying %(name)s: its replica is starting.") % {"name": deployment.name})
            return redirect("deployment", name=deployment.name)
        return redirect("enhancement-job", job_id=job.pk)
    base_deployment = job.base_model.deployments.filter(state="ready").first()
    return render(request, "enhancement/job.html", {
        "job": job, "stage_label": selectors.stage_label(job), "chosen": job.plan.get("chosen"),
        "plan_rows": selectors.with_reasons([job.plan["chosen"], *job.plan.get("alternatives", [])])
        if job.plan.get("chosen") else [],
        "log": runner.log_tail(job, 25),
        "outputs": job.output_models.all(), "report_rows": selectors.report_rows(job),
        "on_training_data": selectors.measured_on_training_data(job), "measured_step_s": selectors.measured_step_s(job),
        "base_deployment": base_deployment, "events": job.cluster_job.events.all() if job.cluster_job else [],
        "disk_bytes": selectors.job_disk_bytes(job)})


@workspace_page
def job_live(request, job_id: int):
    """What the job page polls: state, stage, step, new metric samples and the log tail."""
    job = selectors.scoped(selectors.jobs(workspace=request.workspace), job_id, "Job")
    since = _number(request.GET.get("since") or -1, "since", int)
    return JsonResponse({"state": job.state, "stage": selectors.stage_label(job), "step": job.step,
                         "total_steps": job.total_steps, "error": job.error,
                         "samples": selectors.metric_series(job=job, since_step=since),
                         "log": runner.log_tail(job, 25)})
