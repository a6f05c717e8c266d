"""How byte counts are written in reports, errors and printed programs."""


def fmt_bytes(n):
    """1536 -> '1.5 KiB' (bytes below 1 KiB as integers)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
