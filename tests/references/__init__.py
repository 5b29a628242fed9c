"""Each family's HF reference for the conformance kit: ``tests/references/<family>.py`` defines
``REFERENCE = tests.family_kit.FamilyReference(...)`` (found by the family's name; see ``tests/family_kit.py``)."""
