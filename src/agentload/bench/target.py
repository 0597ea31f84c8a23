"""Where a benchmark sends its load: a real server over HTTP, or the simulator in process on virtual time."""

from __future__ import annotations

from dataclasses import dataclass

from agentload.capacity.profile import ServingProfile, load_profile, with_offload
from agentload.endpoint.transport import Transport, signed_transport
from agentload.sim.agentmodel import AgentBehaviour
from agentload.sim.behaviour import Behaviour
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
    # The key and the URL's credentials sign the transport, so the load, the token sizing and the /metrics scrapes
    # all carry them; the target keeps only the base to build requests on and the masked URL to record.
    server, transport = signed_transport(url, api_key)
    return Target(transport, server.base, model, server.shown, virtual=False, engine=engine)


def sim_target(profile_name: str, behaviour: Behaviour | None = None, offload_gib: float | None = None) -> Target:
    """A fresh in-process simulated server (the caller builds one per level so levels do not share a cache).

    Its model is the agent behaviour, as for ``agentload sim`` and ``run``: its own replies are short, so a
    benchmark's exact output lengths come from asking for them (``ignore_eos`` + ``min_tokens``), as on vLLM, and
    ``--natural-output`` sees the model's own lengths.
    """
    profile = load_profile(profile_name)
    if offload_gib is not None:
        profile = with_offload(profile, offload_gib)
    server = SimServer(SimConfig(profile=profile, behaviour=behaviour or AgentBehaviour()))
    return Target(
        InProcessTransport(server),
        "http://sim.invalid",
        server.model_name,
        f"sim:{profile.name} (in-process, virtual time)",
        virtual=True,
        profile=profile,
        engine="agentload-sim",
    )
