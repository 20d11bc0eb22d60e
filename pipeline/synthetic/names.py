"""Invented words and names for synthetic tasks, drawn from a seeded :class:`random.Random`.

Invented rather than taken from a word list so that any number of distinct items can be drawn
(a 128K-token word list needs thousands) and so that an answer cannot be guessed from what a model
knows about real people or places. Pseudo-words are consonant-vowel syllables (``tovima``,
``kelu``); names capitalize them.
"""

from __future__ import annotations

import random

# fmt: off
ADJECTIVES = (
    "amber", "ancient", "bitter", "bold", "brave", "bright", "calm", "clever", "copper", "crimson",
    "curious", "distant", "eager", "electric", "emerald", "fierce", "gentle", "golden", "hidden", "hollow",
    "humble", "icy", "ivory", "jolly", "lively", "lonely", "lucky", "misty", "noble", "olive", "patient",
    "quiet", "rapid", "restless", "rusty", "scarlet", "silent", "silver", "sleepy", "solar", "steady",
    "swift", "tidy", "velvet", "violet", "wandering", "wild", "woolen",
)
NOUNS = (
    "anchor", "badger", "beacon", "canyon", "cedar", "comet", "compass", "falcon", "fern", "fjord",
    "glacier", "harbor", "hedgehog", "heron", "island", "kettle", "lantern", "lemur", "lighthouse",
    "meadow", "meteor", "minnow", "monsoon", "nebula", "orchard", "otter", "pebble", "pelican", "pine",
    "quarry", "raven", "reef", "saddle", "sparrow", "spruce", "summit", "thistle", "thunder", "tortoise",
    "tundra", "valley", "walrus", "willow", "window", "wombat", "yak", "zephyr", "zeppelin",
)
FIRST_NAMES = (
    "Ada", "Amara", "Bram", "Chiara", "Dmitri", "Elif", "Farid", "Greta", "Hana", "Ines", "Jonas", "Kenji",
    "Lucia", "Malik", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Soren", "Talia", "Umar", "Vera",
    "Wendell", "Ximena", "Yusuf", "Zora", "Anders", "Beatriz", "Cyrus", "Delphine", "Emeka", "Freya",
    "Gideon", "Hollis", "Ilse", "Jasper", "Keiko", "Leandro", "Mireille",
)
# fmt: on
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_PLACE_ENDINGS = ("ford", "wick", "ton", "dale", "mere", "haven", "field", "bury")


def pseudo_word(rng: random.Random, syllables: int | None = None) -> str:
    """A lower-case invented word of ``syllables`` consonant-vowel syllables (default 2 or 3)."""
    n = syllables if syllables is not None else rng.choice((2, 3))
    return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(n))


def person_name(rng: random.Random) -> str:
    """A first name and an invented surname, e.g. ``Vera Tolimak``."""
    return f"{rng.choice(FIRST_NAMES)} {pseudo_word(rng, 3).capitalize()}"


def place_name(rng: random.Random) -> str:
    """An invented town name, e.g. ``Kelubury``."""
    return pseudo_word(rng, 2).capitalize() + rng.choice(_PLACE_ENDINGS)


def pet_name(rng: random.Random) -> str:
    """An invented short name, e.g. ``Tovi``."""
    return pseudo_word(rng, 2).capitalize()


def society_name(rng: random.Random) -> str:
    """An invented society, e.g. ``Copper Heron Society``."""
    return f"{rng.choice(ADJECTIVES).capitalize()} {rng.choice(NOUNS).capitalize()} Society"
