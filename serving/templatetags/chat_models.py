"""How a chat model is named in the forms that offer it: base models say they only complete text, and the
recommended instruction-tuned model says so."""

from django import template
from django.utils.translation import gettext as _

from serving.models import Deployment, ModelGroup
from serving.preset_names import COMPLETION_ONLY, RECOMMENDED_CHAT
from serving.selectors import is_completion_only

register = template.Library()


@register.filter
def chat_model_label(item: Deployment | ModelGroup | str) -> str:
    name = getattr(item, "name", item)
    if is_completion_only(item, COMPLETION_ONLY):
        return _("%(name)s (completion only: continues text, does not follow instructions)") % {"name": name}
    if name == RECOMMENDED_CHAT:
        return _("%(name)s (recommended)") % {"name": name}
    return name
