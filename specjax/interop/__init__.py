"""Checkpoint formats of other codebases: Hugging Face targets (`hf.py`) and Z Lab DFlash
drafters (`zlab.py`). Each module is a name table plus small read/write functions; the model
code never learns a foreign tensor name."""
