"""Running the stages: the stage table, a compute process (resident models, heartbeats, torchrun) and what it reports."""
