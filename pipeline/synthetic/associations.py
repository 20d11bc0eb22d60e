"""The associations of the ``nolima_needle`` task, after NoLiMa (Modarressi et al., 2025): a fact
names a thing (a landmark, a dish) and the question names what it implies (a city, a country), so
that no content word of the question appears in the fact and finding the fact takes one hop of
world knowledge, not a literal match.

Each :class:`Relation` gives fact templates (``{name}``: the character, ``{item}``), question
templates (``{place}``) and ``(item, place)`` pairs. No template of a relation shares a content word
with its other side, and no item contains a word of its place (``tests/pipeline/test_synthetic_helmet.py``
checks every combination).
"""

from __future__ import annotations

from typing import NamedTuple


class Relation(NamedTuple):
    """Facts ``{name} ... {item}``, questions ``... {place}?`` and the ``(item, place)`` pairs."""

    facts: tuple[str, ...]
    questions: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...]


# fmt: off
LANDMARKS = Relation(
    facts=(
        "{name} lives next to {item}.",
        "{name} works across the street from {item}.",
    ),
    questions=(
        "Which character has been to {place}?",
        "Which character has visited {place}?",
    ),
    pairs=(
        ("the Semper Opera House", "Dresden"), ("the Brandenburg Gate", "Berlin"),
        ("the Colosseum", "Rome"), ("the Golden Gate Bridge", "San Francisco"), ("Big Ben", "London"),
        ("the Acropolis", "Athens"), ("the Hagia Sophia", "Istanbul"), ("the Kremlin", "Moscow"),
        ("the Sagrada Familia", "Barcelona"), ("the Space Needle", "Seattle"), ("the Atomium", "Brussels"),
        ("the Little Mermaid statue", "Copenhagen"), ("the Petronas Towers", "Kuala Lumpur"),
        ("the CN Tower", "Toronto"), ("the Charles Bridge", "Prague"), ("the Alhambra", "Granada"),
        ("the Rialto Bridge", "Venice"), ("the Forbidden City", "Beijing"), ("the Burj Khalifa", "Dubai"),
        ("the Taj Mahal", "Agra"), ("the Louvre", "Paris"), ("the Rijksmuseum", "Amsterdam"),
        ("the Hofburg Palace", "Vienna"), ("the Gateway of India", "Mumbai"), ("the Wawel Castle", "Krakow"),
    ),
)
DISHES = Relation(
    facts=(
        "{name} cooked {item} for the neighbours last night.",
        "{name} made {item} for dinner.",
    ),
    questions=(
        "Which character knows a recipe from {place}?",
        "Which character has tried the cuisine of {place}?",
    ),
    pairs=(
        ("paella", "Spain"), ("pierogi", "Poland"), ("bibimbap", "Korea"), ("moussaka", "Greece"),
        ("goulash", "Hungary"), ("ceviche", "Peru"), ("poutine", "Canada"), ("feijoada", "Brazil"),
        ("haggis", "Scotland"), ("borscht", "Ukraine"), ("sushi", "Japan"), ("pho", "Vietnam"),
        ("tagine", "Morocco"), ("fondue", "Switzerland"),
    ),
)
# fmt: on
RELATIONS: tuple[Relation, ...] = (LANDMARKS, DISHES)
