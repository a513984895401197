"""Dependencies of the routes, declared once; tests override them like any FastAPI dependency."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from faasdl.controller.jobs import Controller


def get_controller(request: Request) -> Controller:
    controller: Controller = request.app.state.controller
    return controller


ControllerDep = Annotated[Controller, Depends(get_controller)]
