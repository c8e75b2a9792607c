"""The service: pipeline config, the pipeline run store, the shard store of counting partials, scheduling."""
