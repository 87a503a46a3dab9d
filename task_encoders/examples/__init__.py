"""Worked examples of new modalities (see docs/encoders.md, "Adding a modality")."""
