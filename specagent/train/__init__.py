"""The train stage: LoRA drafter (`drafter.py`), verdict head or generative verdict
(`verdict.py`, figures in `verdict_metrics.py`), offline acceptance during training
(`acceptance.py`); what they share in `common.py`. Reads the datasets `specagent mine`
writes; heavy imports (torch, transformers, trl, peft) stay inside these modules."""
