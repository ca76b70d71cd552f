"""The rollout service: engines fed by the rollout request scheduler, engine replicas and the
service actor trainers reach over HTTP."""
