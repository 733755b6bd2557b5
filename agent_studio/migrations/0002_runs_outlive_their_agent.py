# A run belongs to its workspace and may outlive its agent (kept when the agent is deleted); runs and evaluations
# no longer hold an agent's versions, so an agent that has run can be deleted.

import django.db.models.deletion
from django.db import migrations, models


def fill_workspaces(apps, schema_editor):
    AgentRun = apps.get_model("agent_studio", "AgentRun")
    Agent = apps.get_model("agent_studio", "Agent")
    for agent in Agent.objects.only("pk", "workspace_id"):
        AgentRun.objects.filter(agent_id=agent.pk).update(workspace_id=agent.workspace_id)


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0002_known_roles'),
        ('agent_studio', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='agentrun',
            name='agent_name',
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name='agentrun',
            name='workspace',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name='agent_runs',
                                    to='accounts.workspace'),
        ),
        migrations.RunPython(fill_workspaces, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='agentrun',
            name='workspace',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='agent_runs',
                                    to='accounts.workspace'),
        ),
        migrations.AlterField(
            model_name='agentevalrun',
            name='version',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='eval_runs',
                                    to='agent_studio.agentversion'),
        ),
        migrations.AlterField(
            model_name='agentrun',
            name='agent',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='runs',
                                    to='agent_studio.agent'),
        ),
        migrations.AlterField(
            model_name='agentrun',
            name='thread',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='runs',
                                    to='agent_studio.agentthread'),
        ),
        migrations.AlterField(
            model_name='agentrun',
            name='version',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='runs',
                                    to='agent_studio.agentversion'),
        ),
    ]
