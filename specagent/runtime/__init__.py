"""What the stages share at run time, below them and above core, engines and environments:
assembling a run from its config (`assembly`), the episode loop and its records
(`episodes`), drafting and labeling at cut points (`drafting`, `labelers`), provenance,
the `run` command and transcripts. The stages (data, train, serve, eval) import this
package, never each other (the import-linter contract in pyproject.toml)."""
