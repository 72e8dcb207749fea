"""Shipped agent environments (procedural, seeded, each with a held-out split). No torch here."""
