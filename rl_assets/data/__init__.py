"""The data stages: raw sources read into one versioned table (raw_data), then the prompts split from it."""
