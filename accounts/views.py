from typing import Any

from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.throttles import signin_refused


class ThrottledLoginView(LoginView):
    """`/accounts/login/`: Django's sign-in form, with each attempt counted per client address and
    per account; over either rate it answers 429 with Retry-After and checks no password."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        wait = signin_refused(request, request.POST.get("username", ""))
        if wait is None:
            return super().post(request, *args, **kwargs)
        response = render(request, "registration/throttled.html", {"wait": wait}, status=429)
        response["Retry-After"] = str(wait)
        return response
