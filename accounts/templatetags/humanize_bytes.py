from django import template

register = template.Library()


@register.filter
def gib(value) -> str:
    """Bytes as GiB with one decimal, for memory sizes."""
    try:
        return f"{int(value) / 2**30:.1f} GiB"
    except (TypeError, ValueError):
        return "—"
