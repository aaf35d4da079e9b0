"""tinytrain: integer-only on-device training, bit-exact between laptop and microcontroller."""

__version__ = "0.1.0"
