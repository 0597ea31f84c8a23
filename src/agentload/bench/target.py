"""Where a benchmark sends its load: a real server over HTTP, or the simulator in process on virtual time."""

from __future__ import annotations

from dataclasses import dataclass

from agentload.capacity.profile import ServingProfile, load_profile
from agentload.endpoint.transport import AiohttpTransport, BearerTransport, Transport
from agentload.sim.behaviour import Behaviour, FillerBehaviour
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer


@dataclass
class Target:
    transport: Transport
    base_url: str
    model: str
    description: str
    virtual: bool  # True: run on a VirtualTimeLoop (in-process simulator, no sockets)
    profile: ServingProfile | None = None  # the simulated server's profile, when there is one
    engine: str | None = None  # as endpoint.probe names it (vllm, sglang, ...), None when unknown


def http_target(url: str, model: str, engine: str | None = None, api_key: str | None = None) -> Target:
    # The key signs the transport, so the load, the token sizing and the /metrics scrapes all carry it.
    transport: Transport = AiohttpTransport()
    if api_key:
        transport = BearerTransport(transport, api_key)
    return Target(transport, url, model, url, virtual=False, engine=engine)


def sim_target(profile_name: str, behaviour: Behaviour | None = None) -> Target:
    """A fresh in-process simulated server (the caller builds one per level so levels do not share a cache)."""
    profile = load_profile(profile_name)
    server = SimServer(SimConfig(profile=profile, behaviour=behaviour or FillerBehaviour()))
    return Target(
        InProcessTransport(server),
        "http://sim.invalid",
        server.model_name,
        f"sim:{profile.name} (in-process, virtual time)",
        virtual=True,
        profile=profile,
        engine="agentload-sim",
    )
