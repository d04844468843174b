"""The built-in online-store customer-service domain: ``StoreEnv`` and its scripted expert."""

from specagent.envs.store.env import POLICY, StoreEnv
from specagent.envs.store.expert import expert_steps

__all__ = ["POLICY", "StoreEnv", "expert_steps"]
