"""What every stage shares: params, paths, atomic storage, table schemas, checkpoints, the policy and its tokenizer."""
