from accounts.bootstrap import bootstrap_step


@bootstrap_step(order=30)
def preset_models(say) -> None:
    from serving.presets import deploy_presets, register_presets
    from serving.services import resume_deployments

    deploy_presets(say, register_presets(say))
    for deployment in resume_deployments():
        say(f"Starting {deployment.name} again")
