"""Worked examples of new modalities (see the README, section "Adding a modality")."""
