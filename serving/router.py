"""Picks a replica for each gateway request: a weighted random choice over the ready replicas that are not
cooling down after a failure. The routing table is cached for a second so that the hot path rarely touches
the database; cooldowns live in this process (the gateway runs as one ASGI process per node). Database reads
run off Django's one sync thread, which a sync view calling the gateway in this same process may be holding."""

import random
import time
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

from serving.engines.base import engine
from serving.models import Deployment, ServingState

TABLE_TTL_S = 1.0


@dataclass(frozen=True)
class Route:
    replica_id: int
    base_url: str
    weight: float

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
    routes: list[Route] = field(default_factory=list)

    def visible_to(self, workspace_id: int) -> bool:
        return self.workspace_id is None or self.workspace_id == workspace_id


def _load(name: str) -> Target | None:
    deployment = Deployment.objects.select_related("model").filter(name=name).first()
    if deployment is None:
        return None
    model = deployment.model
    adapter = engine(deployment.engine)
    routes = [Route(replica_id=r.pk, base_url=r.base_url, weight=r.weight)
              for r in deployment.replicas.filter(state=ServingState.READY).exclude(base_url="")]
    return Target(
        deployment_id=deployment.pk, name=deployment.name, workspace_id=deployment.workspace_id,
        engine=deployment.engine, state=deployment.state,
        capabilities=adapter.capabilities(model),
        context_length=adapter.context_length(model=model, settings=deployment.settings),
        cooldown_s=deployment.cooldown_s, model_path=model.path, api_key=model.api_key, routes=routes,
    )


def _load_visible(workspace_id: int) -> list[Target]:
    names = Deployment.objects.filter(state=ServingState.READY).values_list("name", flat=True)
    targets = [_load(name) for name in names]
    return [t for t in targets if t is not None and t.visible_to(workspace_id)]


class Router:
    def __init__(self) -> None:
        self._table: dict[str, tuple[float, Target | None]] = {}
        self._cooling_until: dict[int, float] = {}

    async def resolve(self, name: str) -> Target | None:
        cached = self._table.get(name)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        target = await sync_to_async(_load, thread_sensitive=False)(name)
        self._table[name] = (time.monotonic() + TABLE_TTL_S, target)
        return target

    async def visible_targets(self, workspace_id: int) -> list[Target]:
        return await sync_to_async(_load_visible, thread_sensitive=False)(workspace_id)

    def pick(self, target: Target, *, exclude: set[int]) -> Route | None:
        now = time.monotonic()
        candidates = [r for r in target.routes
                      if r.replica_id not in exclude and self._cooling_until.get(r.replica_id, 0.0) <= now]
        if not candidates:
            return None
        return random.choices(candidates, weights=[r.weight for r in candidates])[0]

    def cool_down(self, route: Route, seconds: float) -> None:
        self._cooling_until[route.replica_id] = time.monotonic() + seconds


router = Router()
