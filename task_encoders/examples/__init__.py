"""Worked examples of new modalities (see ``docs/adding_a_modality.md``)."""
