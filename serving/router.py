"""Resolves a `model` name to a deployment or a model group (serving/groups/), and picks a replica for each gateway
request: a weighted random choice over the ready replicas that are not cooling down after a failure. The routing
table is cached for a second, and kept fresh in the background for the names in use, so that requests do not wait
on the database. Cooldowns live in each web worker process: another worker may still try a failed replica once, and
fails over from it as from any other, until the health check takes the replica out of every table. Database reads
run off Django's one sync thread, which a sync view calling the gateway in this same process may be holding."""

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

from cluster.models import NodeStatus
from serving.engines.base import engine
from serving.models import Deployment, GroupPolicy, ModelGroup, ServingState
from workbridge import vault
from workbridge.egress import Allowlist
from workbridge.selectors import allowlist_for

logger = logging.getLogger(__name__)
TABLE_TTL_S = 1.0
# A name asked for within this long is reloaded every half TTL in the background, so that even an occasional
# request finds its entry fresh in memory rather than paying for database reads before its first token.
KEEP_FRESH_S = 60.0


@dataclass(frozen=True)
class Route:
    replica_id: int
    base_url: str
    weight: float
    # The key the replica's engine requires; empty for an external endpoint, which takes the model's.
    api_key: str = ""

    @property
    def label(self) -> str:
        return str(self.replica_id)


@dataclass
class Target:
    deployment_id: int
    name: str
    workspace_id: int | None
    engine: str
    state: str
    capabilities: set[str]
    context_length: int | None
    cooldown_s: float
    model_path: str
    api_key: str
    tool_strategy: str = "native"
    # Where an external endpoint (a user's URL) may be reached: it is called through the egress guard.
    allowlist: Allowlist | None = None
    routes: list[Route] = field(default_factory=list)

    def visible_to(self, workspace_id: int) -> bool:
        return self.workspace_id is None or self.workspace_id == workspace_id


@dataclass
class GroupTarget:
    """A model group: which deployment stands for each member, and the policy that picks between them."""

    group_id: int
    name: str
    workspace_id: int | None
    policy: str
    threshold: float
    settings: dict
    # "big" and, for route and cascade, "small": deployment names. A speculative group's big member is the big
    # model's deployment that decodes with the draft.
    members: dict[str, str]
    # Each member's cost per 1,000 tokens, in the group's units.
    costs: dict[str, float]
    capabilities: set[str]
    # Ready when at least one member is: a request then answers, through a recorded fallback if need be.
    state: str

    def visible_to(self, workspace_id: int) -> bool:
        return self.workspace_id is None or self.workspace_id == workspace_id


def _load_group(name: str) -> GroupTarget | None:
    group = ModelGroup.objects.select_related("big__model", "small__model", "speculative_deployment__model").filter(
        name=name).first()
    if group is None:
        return None
    big = group.speculative_deployment if group.policy == GroupPolicy.SPECULATIVE else group.big
    deployments = {"big": big} if group.policy == GroupPolicy.SPECULATIVE or group.small is None else {
        "big": big, "small": group.small}
    deployments = {member: d for member, d in deployments.items() if d is not None}
    capabilities = set.intersection(*(engine(d.engine).capabilities(d.model) for d in deployments.values())) \
        if deployments else set()
    costs = dict(group.settings.get("costs") or {})
    for member, deployment in deployments.items():
        # By default a member's cost follows its parameters (in millions per 1,000 tokens), so it tracks compute.
        costs.setdefault(member, (deployment.model.parameter_count or 0) / 1e6)
    ready = any(d.state == ServingState.READY for d in deployments.values())
    return GroupTarget(group_id=group.pk, name=group.name, workspace_id=group.workspace_id, policy=group.policy,
                       threshold=group.threshold, settings=group.settings,
                       members={member: d.name for member, d in deployments.items()}, costs=costs,
                       capabilities=capabilities, state=ServingState.READY if ready else ServingState.STOPPED)


def _load(name: str) -> Target | GroupTarget | None:
    deployment = Deployment.objects.select_related("model").filter(name=name).first()
    if deployment is None:
        return _load_group(name)
    model = deployment.model
    adapter = engine(deployment.engine)
    # A node whose worker stopped answering heartbeats takes its replicas out of every table.
    ready = deployment.replicas.filter(state=ServingState.READY).exclude(base_url="").exclude(
        node__status=NodeStatus.UNHEALTHY)
    # A replica whose engine key cannot be decrypted is left out until its node restarts it with a new one.
    routes = [Route(replica_id=r.pk, base_url=r.base_url, weight=r.weight, api_key=r.api_key) for r in ready
              if not vault.unreadable(r.api_key)]
    return Target(
        deployment_id=deployment.pk, name=deployment.name, workspace_id=deployment.workspace_id,
        engine=deployment.engine, state=deployment.state,
        capabilities=adapter.capabilities(model),
        context_length=adapter.context_length(model=model, settings=deployment.settings),
        cooldown_s=deployment.cooldown_s, model_path=model.path, api_key=model.api_key,
        tool_strategy=deployment.tool_strategy, routes=routes,
        allowlist=None if adapter.runs_process else allowlist_for(workspace_id=deployment.workspace_id),
    )


def _load_many(names: list[str]) -> list[Target | GroupTarget | None]:
    return [_load(name) for name in names]


def _load_visible(workspace_id: int) -> list[Target | GroupTarget]:
    names = [*Deployment.objects.filter(state=ServingState.READY).values_list("name", flat=True),
             *ModelGroup.objects.values_list("name", flat=True)]
    targets = [_load(name) for name in names]
    return [t for t in targets if t is not None and t.state == ServingState.READY and t.visible_to(workspace_id)]


class Router:
    def __init__(self) -> None:
        self._table: dict[str, tuple[float, Target | GroupTarget | None]] = {}  # name: (expires at, target)
        self._asked_at: dict[str, float] = {}
        self._refresher: asyncio.Task | None = None
        # Keyed by replica and address: a replica restarted on another port (or a new one reusing the id) is a new
        # process, which is not held to the old one's cool-down.
        self._cooling_until: dict[tuple[int, str], float] = {}

    async def resolve(self, name: str) -> Target | GroupTarget | None:
        self._asked_at[name] = time.monotonic()
        self._keep_fresh()
        cached = self._table.get(name)
        if cached is None or cached[0] <= time.monotonic():
            await self._reload([name])
        return self._table[name][1]

    async def _reload(self, names: list[str]) -> None:
        # Counted from before the reads, so that no entry is ever used more than TABLE_TTL_S after them.
        expires_at = time.monotonic() + TABLE_TTL_S
        targets = await sync_to_async(_load_many, thread_sensitive=False)(names)
        self._table.update((name, (expires_at, target)) for name, target in zip(names, targets))

    def _keep_fresh(self) -> None:
        # A task ends with its event loop (tests run one per call), so a done one is started again in this one.
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.create_task(self._refresh_names_in_use())

    async def _refresh_names_in_use(self) -> None:
        while True:
            await asyncio.sleep(TABLE_TTL_S / 2)
            unused_since = time.monotonic() - KEEP_FRESH_S
            for name in [name for name, at in self._asked_at.items() if at < unused_since]:
                del self._asked_at[name]
                self._table.pop(name, None)
            if not self._asked_at:
                return
            try:
                await self._reload(list(self._asked_at))
            except Exception:  # a failed refresh only lets entries expire: requests then read the database
                logger.exception("Refreshing the routing table failed")

    async def visible_targets(self, workspace_id: int) -> list[Target | GroupTarget]:
        return await sync_to_async(_load_visible, thread_sensitive=False)(workspace_id)

    def pick(self, target: Target, *, exclude: set[int]) -> Route | None:
        """A weighted choice among the replicas not yet tried, preferring those not cooling down. When every one
        left is cooling down, the one whose cool-down ends first is tried all the same: a cool-down steers traffic
        to other replicas, it never strands a deployment (one slow answer of a lone replica would otherwise refuse
        every request for cooldown_s, though its health checks pass)."""
        now = time.monotonic()
        untried = [r for r in target.routes if r.replica_id not in exclude]
        cool = [r for r in untried if self._cooling_until.get((r.replica_id, r.base_url), 0.0) <= now]
        if cool:
            return random.choices(cool, weights=[r.weight for r in cool])[0]
        return min(untried, key=lambda r: self._cooling_until[(r.replica_id, r.base_url)], default=None)

    def cool_down(self, route: Route, seconds: float) -> None:
        self._cooling_until[(route.replica_id, route.base_url)] = time.monotonic() + seconds


router = Router()
