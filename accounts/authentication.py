from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

from accounts import services
from accounts.errors import Unauthenticated


class ApiKeyAuthentication(BaseAuthentication):
    """`Authorization: Bearer afk_...`: the request acts as the key's creator, inside the key's workspace."""

    keyword = b"bearer"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword:
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("The Authorization header must be 'Bearer <api key>'.")
        try:
            api_key = services.authenticate_api_key(raw=parts[1].decode(errors="replace"))
        except Unauthenticated as exc:
            raise AuthenticationFailed(exc.message)
        return api_key.created_by, api_key

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


class ApiKeyScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema describes a workspace API key, so clients and the fuzzer know to send one."""

    target_class = ApiKeyAuthentication
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A workspace API key (afk_…)."}
